"""Gas on the named-buffer road (issue 27; docs/metering.md, "Named-buffer
runs"): the meter's bind group chosen per kernel, runaway named kernels
ended by their budget with the port untouched, looping named kernels still
right, and gas counted by hand."""

from __future__ import annotations

from pathlib import Path

import time

import numpy as np
import pytest
from conftest import start_port

from kem_port.client import PortError
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.named import named_gas
from kem_port.gpu.named.binding_model import NamedCall
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.gpu.wgsl.wgsl_canonical import canonical
from kem_port.kernel_store import source_from_bytes
from kem_port.wire import terms


def _kernel(groups: tuple[int, ...], loop: bool = True) -> str:
    decls = "".join(f"@group({g}) @binding(0) var<storage, read_write> b{g}: array<u32>;\n" for g in groups)
    return canonical(decls + "@compute @workgroup_size(1) fn main() { "
                     + ("for (var k = 0u; k < 3u; k++) { } " if loop else "") + f"b{groups[0]}[0] = 1u; }}")


@pytest.mark.parametrize("groups, chosen", [((0,), 1), ((0, 3), 1), ((1,), 0), ((0, 1, 2), 3), ((0, 2, 1), 3)])
def test_the_gas_group_is_the_lowest_group_the_kernel_leaves_free(groups, chosen):
    text = _kernel(groups)
    assert wgsl_gas.gas_group(text) == chosen
    form = wgsl_gas.named_gas_form(text)
    assert form.metered and form.group == chosen
    assert f"@group({chosen}) @binding(0) var<uniform> kem_gas_cap" in form.text
    assert f"@group({chosen}) @binding(1) var<storage, read_write> kem_gas_meter" in form.text


def test_a_looping_kernel_that_declares_all_four_groups_is_refused_naming_the_limit():
    with pytest.raises(KemError) as caught:
        wgsl_gas.named_gas_form(_kernel((0, 1, 2, 3)))
    assert caught.value.reason == "bad_kernel"
    assert "declares all of WebGPU's 4 (0-3)" in caught.value.detail and caught.value.detail.split(":")[0].isdigit()
    # Without a loop there is nothing to meter: the kernel is left as written.
    text = _kernel((0, 1, 2, 3), loop=False)
    assert wgsl_gas.named_gas_form(text) == wgsl_gas.GasForm(text, False)


def test_the_execute_road_keeps_group_1_and_refuses_other_groups():
    assert wgsl_gas.gas_form(_kernel((0,))).group == wgsl_gas.GROUP == 1
    with pytest.raises(KemError) as caught:
        wgsl_gas.gas_form(_kernel((0, 2)))
    assert "@group(0) only" in caught.value.detail


def test_a_group_kem_cannot_read_or_the_meters_own_is_refused_in_a_looping_kernel():
    named = canonical("const G = 0;\n@group(G) @binding(0) var<storage, read_write> b: array<u32>;\n"
                      "@compute @workgroup_size(1) fn main() { loop { break; } b[0] = 1u; }")
    with pytest.raises(KemError) as caught:
        wgsl_gas.named_gas_form(named)
    assert caught.value.reason == "bad_kernel" and "integer literals" in caught.value.detail
    with pytest.raises(KemError) as caught:
        wgsl_gas.gas_form(_kernel((0, 2)), 2)
    assert "the gas meter's @group(2)" in caught.value.detail


# -- the named road, through the real port ------------------------------------

NODE_LIMIT = 64 * 5000  # the port's KEM_GAS_LIMIT here: a runaway of 64 invocations ends after 4999 iterations each

RUNAWAYS = {
    # Spins on a word no one writes: only a budget ends it.
    "tight": """
@group(0) @binding(0) var<storage, read> flag: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = 0u;
  while (flag[0] != 12345u) { x += 1u; }
  out[g.x] = x;
}
""",
    "nested": """
@group(0) @binding(0) var<storage, read> flag: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = 0u;
  loop {
    for (var i = 0u; i < 1000000u; i++) { x += i ^ flag[0]; }
    if (flag[0] == 12345u) { break; }
  }
  out[g.x] = x;
}
""",
    # A barrier in a loop whose (uniform) exit never comes: its count must break it uniformly.
    "barrier": """
@group(0) @binding(0) var<storage, read> flag: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
var<workgroup> turns: u32;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>,
                                     @builtin(local_invocation_index) l: u32) {
  loop {
    if (l == 0u) { turns += 1u; }
    if (workgroupUniformLoad(&turns) == flag[0]) { break; }
  }
  out[g.x] = turns;
}
""",
    # In a helper function, the kernel's buffers in groups 1 and 2 (the meter takes group 0, left free).
    "groups 1 and 2": """
@group(1) @binding(0) var<storage, read> flag: array<u32>;
@group(2) @binding(3) var<storage, read_write> out: array<u32>;
fn spin(start: u32) -> u32 {
  var x = start;
  loop { if (flag[0] == 12345u) { break; } x += 1u; }
  return x;
}
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { out[g.x] = spin(g.x); }
""",
    # Atomics spinning on a flag only the kernel could set, and never does.
    "atomic flag": """
@group(0) @binding(0) var<storage, read> flag: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<atomic<u32>>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  while (atomicLoad(&out[0]) != 12345u) { atomicAdd(&out[1 + g.x % 63u], flag[0] & 0u); }
}
""",
}
_OUT = {"tight": "out", "nested": "out", "barrier": "out", "groups 1 and 2": "out", "atomic flag": "out"}

KERNELS = {
    **{name.replace(" ", "_"): text for name, text in RUNAWAYS.items()},
    # out[i] = 0 + 1 + ... + (inp[i] - 1): inp[i] iterations per invocation.
    "counting": (Path(__file__).resolve().parent / "gas_kernels" / "counting.wgsl").read_text(),
    # A tiled matmul by named buffers: a barrier loop over tiles, an inner loop over the tile.
    "tiled": """
struct Dims { m: u32, n: u32, k: u32 }
@group(0) @binding(0) var<storage, read> lhs: array<f32>;
@group(0) @binding(1) var<storage, read> rhs: array<f32>;
@group(1) @binding(0) var<uniform> dims: Dims;
@group(1) @binding(1) var<storage, read_write> product: array<f32>;
var<workgroup> ta: array<f32, 64>;
var<workgroup> tb: array<f32, 64>;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
  let row = g.y;
  let col = g.x;
  var sum = 0.0;
  let tiles = (dims.k + 7u) / 8u;
  for (var t = 0u; t < tiles; t++) {
    let ka = t * 8u + l.x;
    let kb = t * 8u + l.y;
    ta[l.y * 8u + l.x] = select(0.0, lhs[row * dims.k + ka], row < dims.m && ka < dims.k);
    tb[l.y * 8u + l.x] = select(0.0, rhs[kb * dims.n + col], kb < dims.k && col < dims.n);
    workgroupBarrier();
    for (var i = 0u; i < 8u; i++) { sum += ta[l.y * 8u + i] * tb[i * 8u + l.x]; }
    workgroupBarrier();
  }
  if (row < dims.m && col < dims.n) { product[row * dims.n + col] = sum; }
}
""",
    # A tree reduction per workgroup of 64 (a barrier loop of 6 halving steps).
    "reduce": """
@group(0) @binding(0) var<storage, read> values: array<u32>;
@group(0) @binding(1) var<storage, read_write> sums: array<u32>;
var<workgroup> part: array<u32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) l: u32,
        @builtin(workgroup_id) w: vec3<u32>) {
  part[l] = select(0u, values[g.x], g.x < arrayLength(&values));
  workgroupBarrier();
  for (var half = 32u; half > 0u; half = half / 2u) {
    if (l < half) { part[l] += part[l + half]; }
    workgroupBarrier();
  }
  if (l == 0u) { sums[w.x] = part[0]; }
}
""",
    # Buffers in groups 0 and 3, a loop: the meter takes group 1, the lowest left free.
    "groups_0_and_3": """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(3) @binding(2) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= arrayLength(&out)) { return; }
  var acc = 1u;
  for (var k = 0u; k < inp[g.x] % 7u; k++) { acc *= 3u; }
  out[g.x] = acc;
}
""",
    # Every group taken and a loop: no group is left for the meter.
    "four_groups": """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(1) @binding(0) var<storage, read> b: array<u32>;
@group(2) @binding(0) var<storage, read> c: array<u32>;
@group(3) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var acc = 0u;
  for (var k = 0u; k < 3u; k++) { acc += a[0] + b[0] + c[0]; }
  out[g.x] = acc;
}
""",
    # The same buffers without a loop: nothing to meter, so it runs as before.
    "four_groups_no_loop": """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(1) @binding(0) var<storage, read> b: array<u32>;
@group(2) @binding(0) var<storage, read> c: array<u32>;
@group(3) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { out[g.x] = a[g.x] + b[g.x] + c[g.x]; }
""",
}


@pytest.fixture(scope="module")
def gas_port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("gas_named")
    for name, text in KERNELS.items():
        (kernels / f"{name}.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache"), KEM_GAS_LIMIT=str(NODE_LIMIT)) as port:
        yield port


def run(port, kernel: str, buffers: dict, **opts) -> dict[str, bytes]:
    """The port's run method; its returned buffers as {name: bytes}."""
    if "outputs" in opts:
        opts["outputs"] = {k.encode(): v for k, v in opts["outputs"].items()}
    got = port.call("run", kernel.encode(), {k.encode(): v for k, v in buffers.items()}, opts)
    return {terms.binary_bytes(k).decode(): terms.binary_bytes(v) for k, v in got.items()}


def counting(port, data: np.ndarray, **opts) -> np.ndarray:
    got = run(port, "counting", {"inp": data.tobytes()}, outputs={"out": data.nbytes}, workgroups=(-(-data.size // 64), 1, 1), **opts)
    return np.frombuffer(got["out"], np.uint32)


def sums_below(data: np.ndarray) -> np.ndarray:
    return (data.astype(np.uint64) * (data.astype(np.uint64) - 1) // 2).astype(np.uint32)


@pytest.mark.parametrize("name", list(RUNAWAYS))
def test_a_runaway_named_kernel_ends_by_its_budget_and_the_port_goes_on(gas_port, rng, name):
    pid = gas_port.proc.pid
    flag = "flag"
    buffers = {flag: np.array([0xFFFFFFFF] * 4, np.uint32).tobytes()}
    started = time.perf_counter()
    with pytest.raises(PortError) as caught:
        run(gas_port, name.replace(" ", "_"), buffers, outputs={_OUT[name]: 4 * 64}, workgroups=(1, 1, 1))
    ran = time.perf_counter() - started
    assert caught.value.reason == "gas_exhausted", caught.value
    assert f"of limit {NODE_LIMIT} (an invocation passed its 4999 loop iterations)" in caught.value.detail
    with pytest.raises(PortError) as caught:  # the call's own budget
        run(gas_port, name.replace(" ", "_"), buffers, outputs={_OUT[name]: 4 * 64}, workgroups=(1, 1, 1), gas_limit=6400)
    assert caught.value.reason == "gas_exhausted" and "of limit 6400 (an invocation passed its 99 loop iterations)" in caught.value.detail
    data = rng.integers(0, 50, 200, dtype=np.uint32)
    np.testing.assert_array_equal(counting(gas_port, data), sums_below(data))  # the next call is right
    assert gas_port.proc.pid == pid and gas_port.proc.poll() is None
    print(f"{name}: gas_exhausted after {ran * 1e3:.1f} ms")


def test_the_calls_gas_limit_bounds_a_correct_kernel_exactly(gas_port, rng):
    data = np.full(128, 10, np.uint32)  # 128 invocations x 10 iterations: 128 + 1280 = 1408 gas
    np.testing.assert_array_equal(counting(gas_port, data, gas_limit=1408), sums_below(data))
    with pytest.raises(PortError) as caught:  # a cap of (1407 - 128) // 128 = 9 iterations each
        counting(gas_port, data, gas_limit=1407)
    assert caught.value.reason == "gas_exhausted" and "of limit 1407 (an invocation passed its 9 loop iterations)" in caught.value.detail
    with pytest.raises(PortError) as caught:  # not even the launch is covered
        counting(gas_port, data, gas_limit=100)
    assert caught.value.reason == "gas_exhausted" and "launching 128 invocations needs 128" in caught.value.detail
    for bad in (0, -5, b"100"):
        with pytest.raises(PortError) as caught:
            counting(gas_port, data, gas_limit=bad)
        assert caught.value.reason == "bad_args" and "gas_limit" in caught.value.detail


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (8, 8, 8), (13, 29, 37), (64, 48, 72)])
def test_a_tiled_matmul_by_named_buffers_is_metered_and_right(gas_port, rng, m, n, k):
    lhs, rhs = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    got = run(gas_port, "tiled", {"lhs": lhs.tobytes(), "rhs": rhs.tobytes(), "dims": np.array([m, n, k, 0], np.uint32).tobytes()},
              outputs={"product": 4 * m * n}, workgroups=(-(-n // 8), -(-m // 8), 1))
    np.testing.assert_allclose(np.frombuffer(got["product"], np.float32).reshape(m, n), lhs @ rhs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 64, 1000, 5000])
def test_a_reduction_by_named_buffers_is_metered_and_right(gas_port, rng, n):
    values = rng.integers(0, 2**20, n, dtype=np.uint32)
    groups = -(-n // 64)
    got = run(gas_port, "reduce", {"values": values.tobytes()}, outputs={"sums": 4 * groups}, workgroups=(groups, 1, 1))
    padded = np.concatenate([values, np.zeros(groups * 64 - n, np.uint32)])
    np.testing.assert_array_equal(np.frombuffer(got["sums"], np.uint32), padded.reshape(groups, 64).sum(axis=1, dtype=np.uint32))


@pytest.mark.parametrize("n", [3, 64, 777])
def test_a_looping_kernel_using_group_3_is_metered_in_the_group_it_leaves_free(gas_port, rng, n):
    data = rng.integers(0, 2**32, n, dtype=np.uint32)
    got = run(gas_port, "groups_0_and_3", {"inp": data.tobytes()}, outputs={"out": 4 * n}, workgroups=(-(-n // 64), 1, 1))
    np.testing.assert_array_equal(np.frombuffer(got["out"], np.uint32), (3 ** (data % 7)).astype(np.uint32))


def test_a_looping_kernel_using_all_four_groups_is_refused_and_one_without_a_loop_runs(gas_port, rng):
    word = np.zeros(64, np.uint32).tobytes()
    with pytest.raises(PortError) as caught:
        run(gas_port, "four_groups", {"a": word, "b": word, "c": word}, outputs={"out": 256}, workgroups=(1, 1, 1))
    assert caught.value.reason == "bad_kernel" and "declares all of WebGPU's 4 (0-3)" in caught.value.detail
    a, b, c = (rng.integers(0, 2**30, 64, dtype=np.uint32) for _ in range(3))
    got = run(gas_port, "four_groups_no_loop", {"a": a.tobytes(), "b": b.tobytes(), "c": c.tobytes()},
              outputs={"out": 256}, workgroups=(1, 1, 1))
    np.testing.assert_array_equal(np.frombuffer(got["out"], np.uint32), a + b + c)


# -- gas counted by hand, in process (the same NamedRuns the port runs) -------

@pytest.fixture(scope="module")
def runner():
    from kem_port.api.runner import Runner

    runner = Runner(Config())
    yield runner
    runner.close()


def _source(name: str):
    return source_from_bytes(name, KERNELS[name].encode(), "test", "local")


@pytest.mark.parametrize("n, workgroups", [(1, 1), (100, 2), (300, 5)])
def test_hand_counted_gas_of_a_named_run_admitted_as_it_runs(runner, rng, n, workgroups):
    """gas = invocations launched (workgroups x 64, those past the data
    included) + loop iterations (inp[i] for each i < n, 0 for the rest)."""
    source = _source("counting")
    admitted = runner.guard.admit_for_session(source, "main", None, gas=True)
    assert admitted.metered and named_gas.gas_text(admitted) == (admitted.text, 1)  # what admission compiled runs
    assert wgsl_gas.named_gas_form(source.text).text in admitted.text  # (then kem's clearing, on lavapipe)
    data = rng.integers(0, 40, n, dtype=np.uint32)
    got = runner.executor.named.run(admitted, NamedCall("counting", {"inp": data.tobytes()}, {"out": 4 * n}, (workgroups, 1, 1)))
    np.testing.assert_array_equal(np.frombuffer(got["out"], np.uint32), sums_below(data))
    assert got.gas == 64 * workgroups + int(data.sum())


def test_hand_counted_gas_of_nested_and_barrier_loops_and_of_a_loop_free_run(runner, rng):
    values = rng.integers(0, 2**20, 192, dtype=np.uint32)  # 3 workgroups of 64, 6 halving steps each
    got = runner.executor.named.run(_source("reduce"), NamedCall("reduce", {"values": values.tobytes()}, {"sums": 12}, (3, 1, 1)))
    assert got.gas == 192 + 192 * 6
    m = n = k = 16  # 2 x 2 workgroups of 8 x 8; 2 tiles, each 8 inner iterations: 1 + 8 per tile
    lhs, rhs = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    call = NamedCall("tiled", {"lhs": lhs.tobytes(), "rhs": rhs.tobytes(), "dims": np.array([m, n, k, 0], np.uint32).tobytes()},
                     {"product": 4 * m * n}, (2, 2, 1))
    got = runner.executor.named.run(_source("tiled"), call)
    np.testing.assert_allclose(np.frombuffer(got["product"], np.float32).reshape(m, n), lhs @ rhs, rtol=1e-4, atol=1e-4)
    assert got.gas == 256 + 256 * 2 * (1 + 8)
    a, b, c = (rng.integers(0, 2**30, 128, dtype=np.uint32) for _ in range(3))
    got = runner.executor.named.run(_source("four_groups_no_loop"), NamedCall(
        "four_groups_no_loop", {"a": a.tobytes(), "b": b.tobytes(), "c": c.tobytes()}, {"out": 512}, (2, 1, 1)))
    assert got.gas == 128  # no loop: its invocations, counted on the host, no meter bound
    with pytest.raises(KemError) as caught:  # its own limit below what it launches
        runner.executor.named.run(_source("four_groups_no_loop"), NamedCall(
            "four_groups_no_loop", {"a": a.tobytes(), "b": b.tobytes(), "c": c.tobytes()}, {"out": 512}, (2, 1, 1), gas_limit=127))
    assert caught.value.reason == "gas_exhausted" and "launching 128 invocations needs 128" in caught.value.detail


def test_a_looping_kernel_with_8_storage_buffers_is_refused_naming_the_meter(runner):
    decls = "".join(f"@group(0) @binding({i}) var<storage, read_write> b{i}: array<u32>;\n" for i in range(8))
    text = decls + ("@compute @workgroup_size(1) fn main() { for (var k = 0u; k < 2u; k++) { "
                    + " ".join(f"b{i}[0] += 1u;" for i in range(8)) + " } }")
    source = source_from_bytes("eight", text.encode(), "test", "local")
    with pytest.raises(KemError) as caught:
        runner.executor.named.run(source, NamedCall("eight", {f"b{i}": bytes(4) for i in range(8)}, {}, (1, 1, 1)))
    assert caught.value.reason == "bad_kernel" and "may use 7 storage" in caught.value.detail


def test_a_run_asked_for_usage_answers_its_gas_beside_its_outputs(gas_port, rng):
    """The usage carrier (port/replies.with_gas): {Outputs, #{gas => G}}
    when the node asks (usage => true), the outputs alone otherwise."""
    data = rng.integers(0, 30, 150, dtype=np.uint32)  # 3 workgroups of 64: 192 invocations + sum(data) iterations
    opts = {"outputs": {b"out": data.nbytes}, "workgroups": (3, 1, 1)}
    outputs, usage = gas_port.call("run", b"counting", {b"inp": data.tobytes()}, {**opts, "usage": True})
    got = {terms.binary_bytes(k).decode(): terms.binary_bytes(v) for k, v in outputs.items()}
    np.testing.assert_array_equal(np.frombuffer(got["out"], np.uint32), sums_below(data))
    assert {terms.atom_name(k): v for k, v in usage.items()} == {"gas": 192 + int(data.sum())}
    plain_reply = gas_port.call("run", b"counting", {b"inp": data.tobytes()}, opts)
    assert isinstance(plain_reply, dict) and len(plain_reply) == 1
    with pytest.raises(PortError) as caught:
        gas_port.call("run", b"counting", {b"inp": data.tobytes()}, {**opts, "usage": 1})
    assert caught.value.reason == "bad_args" and "usage" in caught.value.detail
