"""Many calls, one dispatch (kem_port/gpu/call_table.py): a kernel that
declares the call table computes every call of a batch in one dispatch,
each call's output matching numpy; plain kernels do not opt in."""

from __future__ import annotations

import numpy as np
import pytest
import wgpu

from kem_port.gpu.group import call_table
from kem_port.gpu import native
from kem_port.gpu.wgsl.wgsl_reflect import reflect

U = wgpu.BufferUsage
# The call table ABI's declarations and row search (docs/dispatch.md), as
# every call-table kernel in the tests starts.
TABLE_PREAMBLE = """
struct KemCall { input_offset: u32, input_words: u32, output_offset: u32, output_words: u32 }
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(3) var<storage, read> kem_calls: array<KemCall>;

fn kem_call_of(item: u32) -> KemCall {
    var lo = 0u;
    var hi = arrayLength(&kem_calls) - 1u;
    while (lo < hi) {
        let mid = (lo + hi + 1u) / 2u;
        if (kem_calls[mid].output_offset <= item) { lo = mid; } else { hi = mid - 1u; }
    }
    return kem_calls[lo];
}
"""
# A call-table entry point's head: its item (flattened over x and y), its
# call's row, and k, the item's word within the call's output.
TABLE_ENTRY = """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let item = gid.x + gid.y * groups.x * 64u;
    if (item >= arrayLength(&output_words)) { return; }
    let call = kem_call_of(item);
    let k = item - call.output_offset;
"""
TABLED = TABLE_PREAMBLE + TABLE_ENTRY + """
    // each output word: the call's input word k (zero past its input) times 5, plus the call's input length
    var x = 0u;
    if (k < call.input_words) { x = input_words[call.input_offset + k]; }
    output_words[item] = x * 5u + call.input_words;
}
"""
PLAIN = """
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&output_words)) { output_words[gid.x] = input_words[gid.x]; }
}
"""


def test_only_a_kernel_declaring_binding_3_opts_in():
    assert call_table.opts_in(reflect(TABLED))
    assert not call_table.opts_in(reflect(PLAIN))
    uniform_3 = PLAIN + "\n@group(0) @binding(3) var<uniform> p: vec4<u32>;"
    assert not call_table.opts_in(reflect(uniform_3))


def test_rows_pack_outputs_back_to_back():
    table = call_table.build([call_table.Slot(0, 5, 8), call_table.Slot(8, 0, 3), call_table.Slot(256, 12, 4)])
    rows = [call_table.ROW.unpack_from(table.rows, k * 16) for k in range(3)]
    assert rows == [(0, 2, 0, 2), (2, 0, 2, 1), (64, 3, 3, 1)]
    assert table.output_offsets == (0, 8, 12) and table.output_bytes == 16 and table.items == 4
    assert call_table.workgroups(4, 64, 65535) == (1, 1, 1)
    assert call_table.workgroups(64 * 70000, 64, 65535) == (65535, 2, 1)
    with pytest.raises(ValueError):
        call_table.build([call_table.Slot(2, 4, 4)])


@pytest.fixture(scope="module")
def gpu():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync()
    module = device.create_shader_module(code=TABLED)
    pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    return device, pipe, native.NativePath(device)


def run_table(gpu, inputs: list[bytes], out_sizes: list[int], max_groups: int) -> list[bytes]:
    device, pipe, native = gpu
    slots, packed = [], bytearray()
    for data, out in zip(inputs, out_sizes):
        slots.append(call_table.Slot(len(packed), len(data), out))
        packed += data + bytes(-len(data) % 4)
    table = call_table.build(slots)
    in_buf = device.create_buffer(size=max(len(packed), 4), usage=U.STORAGE | U.COPY_DST)
    out_buf = device.create_buffer(size=table.output_bytes, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    rows = device.create_buffer(size=len(table.rows), usage=U.STORAGE | U.COPY_DST)
    staging = device.create_buffer(size=table.output_bytes, usage=U.MAP_READ | U.COPY_DST)
    native.write(in_buf, 0, packed)
    native.write(rows, 0, table.rows)
    group = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": in_buf, "offset": 0, "size": in_buf.size}},
        {"binding": 1, "resource": {"buffer": out_buf, "offset": 0, "size": table.output_bytes}},
        {"binding": 3, "resource": {"buffer": rows, "offset": 0, "size": len(table.rows)}},
    ])
    enc = native.encoder()
    enc.begin_pass()
    enc.set_pipeline(pipe)
    enc.set_bind_group(group)
    enc.dispatch(*call_table.workgroups(table.items, 64, max_groups))
    enc.end_pass()
    enc.copy(out_buf, 0, staging, 0, table.output_bytes)
    index = native.submit(enc.finish())
    native.wait(native.map_read(staging, 0, table.output_bytes), 0.0, index)
    view = native.mapped(staging, 0, table.output_bytes)
    results = [bytes(view[o : o + n]) for o, n in zip(table.output_offsets, out_sizes)]
    native.unmap(staging)
    return results


def expected(data: bytes, out_size: int) -> bytes:
    words = -(-len(data) // 4)
    x = np.frombuffer(data + bytes(-len(data) % 4), dtype=np.uint32)
    out_words = -(-out_size // 4)
    full = np.zeros(out_words, dtype=np.uint32)
    n = min(words, out_words)
    full[:n] = x[:n]
    return (full * np.uint32(5) + np.uint32(words)).tobytes()[:out_size]


@pytest.mark.parametrize("calls,max_groups", [(1, 65535), (7, 65535), (300, 65535), (300, 3)], ids=["one", "seven", "many", "y-spill"])
def test_every_call_of_one_dispatch_matches_numpy(gpu, rng, calls, max_groups):
    sizes = rng.integers(1, 2000, size=calls)
    inputs = [rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes() for n in sizes]
    out_sizes = [int(n) + int(rng.integers(-3, 9)) if n > 3 else int(n) for n in sizes]
    results = run_table(gpu, inputs, out_sizes, max_groups)
    for k, (data, out, got) in enumerate(zip(inputs, out_sizes, results)):
        assert got == expected(data, out), f"call {k} of {calls}"


# -- through the executor: calls to a call-table kernel share dispatches ---------

from kem_port.config import Config  # noqa: E402
from kem_port.errors import KemError  # noqa: E402
from kem_port.gpu.calls import Job, KernelCall  # noqa: E402
from kem_port.gpu.executor import Executor  # noqa: E402
from kem_port.kernel_store import default_stores, source_from_bytes  # noqa: E402
from kem_port.stats import Stats  # noqa: E402

import reference  # noqa: E402
from conftest import start_port  # noqa: E402
from kem_port.wire import terms  # noqa: E402

TWO_D = TABLED.replace("@workgroup_size(64)", "@workgroup_size(8, 8)")


@pytest.fixture(scope="module")
def executor():
    ex = Executor(Config(max_batch=512, shared_table_kernels=["tabled"]), Stats())
    ex.open()
    return ex


@pytest.fixture(scope="module")
def unshared_executor():
    ex = Executor(Config(max_batch=512), Stats())  # no kernel listed: a dispatch per call-table call
    ex.open()
    return ex


@pytest.mark.parametrize("shared", [True, False], ids=["listed", "unlisted"])
def test_a_batch_mixing_table_and_plain_calls_matches_numpy(executor, unshared_executor, rng, shared):
    executor = executor if shared else unshared_executor
    tabled = source_from_bytes("tabled", TABLED.encode(), "test", "local")
    double = default_stores(None)[0].lookup("double")
    got: dict[int, list] = {}
    jobs, expected, alone = [], {}, 0
    sizes = [1, 4, 7, 64, 1000, 4096, 300_001]  # the last one dispatches alone
    for key in range(200):
        size = int(rng.choice(sizes))
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        got[key] = []
        reply = lambda v, k=key: got[k].append(bytes(v))  # noqa: E731
        fail = lambda e, k=key: got[k].append(e)  # noqa: E731
        if key % 5 == 0:
            jobs.append(Job(KernelCall("double", data, len(data)), double, reply, fail))
            expected[key] = reference.double(data, len(data))
        else:
            out = max(1, size + int(rng.integers(-3, 9)))
            jobs.append(Job(KernelCall("tabled", data, out), tabled, reply, fail))
            expected[key] = expected_tabled(data, out)
            alone += size > 256 * 1024
    calls, dispatches = executor.stats.count("table_calls"), executor.stats.count("table_dispatches")
    executor.run(jobs)
    assert executor.stats.count("batches") >= 1
    for key, want in expected.items():
        assert got[key] == [want], key
    assert executor.stats.count("table_calls") - calls == 160
    # One batch of 200 (max_batch 512): listed, the small calls share one dispatch, each large one has
    # its own; unlisted (the default), every call its own.
    assert executor.stats.count("table_dispatches") - dispatches == (alone + 1 if shared else 160)


def expected_tabled(data: bytes, out_size: int) -> bytes:
    return expected(data, out_size)


def test_table_kernels_refuse_workgroups_params_and_2d_workgroups(executor):
    tabled = source_from_bytes("tabled", TABLED.encode(), "test", "local")
    two_d = source_from_bytes("two_d", TWO_D.encode(), "test", "local")
    outcomes = []
    calls = [
        (KernelCall("tabled", b"abcd", 4, workgroups=(1, 1, 1)), tabled),
        (KernelCall("tabled", b"abcd", 4, params=bytes(16)), tabled),
        (KernelCall("two_d", b"abcd", 4), two_d),
    ]
    jobs = [Job(c, s, reply=outcomes.append, fail=outcomes.append) for c, s in calls]
    executor.run(jobs)
    assert [getattr(o, "reason", o) for o in outcomes] == ["bad_args", "bad_args", "bad_kernel"]
    assert all(isinstance(o, KemError) for o in outcomes)


@pytest.fixture(scope="module")
def double_table_shared():
    with start_port(KEM_SHARED_TABLE_KERNELS="double_table") as client:
        yield client


@pytest.mark.parametrize("shared", [False, True], ids=["default", "listed"])
def test_the_packaged_double_table_kernel_through_the_port(port, double_table_shared, rng, shared):
    """Concurrent callers of double_table each get exactly reference.double
    of their own input; by default each call is its own dispatch (kem's own
    kernel is not listed either), listed they share dispatches."""
    port = double_table_shared if shared else port
    before = port.call("stats")
    sizes = [int(rng.choice([1, 4, 13, 256, 4096, 70_000])) for _ in range(300)]
    inputs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    futures = [port.call_async("execute_kernel", b"double_table", data, 2) for data in inputs]
    for data, fut in zip(inputs, futures):
        assert fut.result(timeout=60) == reference.double(data, 2 * len(data))
    after = port.call("stats")
    count = lambda stats, name: stats.get(terms.atom(name), 0)  # noqa: E731
    calls = count(after, "table_calls") - count(before, "table_calls")
    dispatches = count(after, "table_dispatches") - count(before, "table_dispatches")
    assert calls == 300 and (1 <= dispatches < calls if shared else dispatches == calls)
