"""A group frame to a call-table kernel runs as ONE dispatch (or a few
chunked ones past a limit: kem_port/gpu/group_table.py), through the real
port on the real adapter: values vs numpy for double_table and for a
kernel whose output words differ per call and per word (a reversed copy
plus the call's first input word and the word's index: an input or output
offset off by one slot or one word shows), expired slots, a group beside
single calls of the same kernel in one batch, and groups over a dispatch's
limits (chunked, or taken as their single calls).

Gas (docs/metering.md): both table kernels here find their call by a
binary search, a loop, so they are metered, and a metered kernel's group
job runs as its single calls, which share the batch's table dispatch with
one meter (gpu/gas_meter.py): the group-table job path
(`table_group_jobs`) is taken only by loop-free table kernels, so these
tests count it 0 and check the dispatches and values as before."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import sent, start_port, wait_running
from kem_port.wire import group_frames, terms
from kem_port.client import PortError
from kem_port.config import Config
from kem_port.gpu.group import call_table, group_table
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.gpu.group.group_job import GroupJob
from kem_port.kernel_store import source_from_bytes
from kem_port.stats import Stats
from test_call_table import TABLE_PREAMBLE

# Output word k of a call: its input word (W - 1 - k) (0 past the input),
# plus its first input word, plus k.
REVERSED = TABLE_PREAMBLE + """
@compute @workgroup_size(WIDTH)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let item = gid.x + gid.y * groups.x * WIDTHu;
    if (item >= arrayLength(&output_words)) { return; }
    let call = kem_call_of(item);
    let k = item - call.output_offset;
    var x = 0u;
    if (k < call.input_words) { x = input_words[call.input_offset + call.input_words - 1u - k]; }
    output_words[item] = x + input_words[call.input_offset] + k;
}
"""

# Group jobs that took the group-table path: none for a metered kernel.
GROUP_TABLE_JOBS = 0


def reversed_kernel(width: int) -> str:
    return REVERSED.replace("WIDTH", str(width))


def expected(kernel: str, data: bytes, out_size: int) -> bytes:
    x = np.frombuffer(data + bytes(-len(data) % 4), np.uint32)
    out_words = -(-out_size // 4)
    if kernel == "double_table":
        full = np.zeros(out_words, np.uint32)
        full[: min(len(x), out_words)] = x[:out_words] * np.uint32(2)
    else:
        rev = np.zeros(out_words, np.uint32)
        rev[: min(len(x), out_words)] = x[::-1][:out_words]
        full = rev + x[0] + np.arange(out_words, dtype=np.uint32)
    return full.tobytes()[:out_size]


@pytest.fixture(scope="module")
def tabled_port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("kernels")
    (kernels / "reversed.wgsl").write_text(reversed_kernel(64))
    (kernels / "reversed_one.wgsl").write_text(reversed_kernel(1))  # one row of workgroups: 65,535 words
    # Listed: their calls may share a dispatch across callers (by default each call is its own).
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache"),
                    KEM_SHARED_TABLE_KERNELS="double_table,reversed,reversed_one") as client:
        for kernel in (b"double_table", b"reversed", b"reversed_one"):
            client.call("execute_kernel", kernel, bytes(8), 1)  # admitted and compiled: a group is one job
        yield client


def counts(port) -> dict[str, int]:
    stats = port.call_plain("stats")
    return {key: stats.get(key, 0) for key in ("table_dispatches", "table_calls", "group_jobs", "table_group_jobs", "batches")}


def delta(after: dict, before: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


def run_group(port, rng, kernel: str, n: int, size: int, hint: int = 1, timeouts_ms=60000) -> list[tuple[str, object]]:
    inputs = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]
    futures = port.call_group_async(kernel.encode(), inputs, hint=hint, timeouts_ms=timeouts_ms)
    got = []
    for data, fut in zip(inputs, futures):
        try:
            got.append(("ok", fut.result(60), data))
        except PortError as exc:
            got.append(("error", exc.reason, data))
    return got


@pytest.mark.parametrize("kernel", ["double_table", "reversed"])
@pytest.mark.parametrize("n,size,hint", [(2, 4, 1), (3, 13, 2), (17, 256, 1), (64, 4, 1), (64, 1000, 1), (256, 36, 3)])
def test_a_group_is_one_dispatch_and_each_value_is_numpys(tabled_port, rng, kernel, n, size, hint):
    before = counts(tabled_port)
    got = run_group(tabled_port, rng, kernel, n, size, hint)
    for k, (status, value, data) in enumerate(got):
        assert status == "ok", value
        assert value == expected(kernel, data, hint * size), f"slot {k} of {n}"
    moved = delta(counts(tabled_port), before)
    assert (moved["group_jobs"], moved["table_group_jobs"], moved["table_dispatches"], moved["table_calls"]) == (1, GROUP_TABLE_JOBS, 1, n)


def test_expired_slots_are_not_answered_and_the_others_are(tabled_port, rng):
    """The GPU is busy: the slots with a short timeout hear timeout (from the
    port, once), the others their values; the group is still one dispatch."""
    # 2 s, running before the group is sent (see test_group_frames).
    busy_id, busy = sent(tabled_port, "test_hook", terms.atom("sleep_gpu"), 2000)
    wait_running(tabled_port, busy_id)
    timeouts = [200, 0, 200, 60000, 0, 200, 60000, 200]
    before = counts(tabled_port)
    got = run_group(tabled_port, rng, "reversed", len(timeouts), 52, 2, timeouts)
    for timeout_ms, (status, value, data) in zip(timeouts, got):
        if timeout_ms == 200:
            assert (status, value) == ("error", "timeout")
        else:
            assert (status, value) == ("ok", expected("reversed", data, 104))
    busy.result(30)
    moved = delta(counts(tabled_port), before)
    assert (moved["group_jobs"], moved["table_group_jobs"], moved["table_dispatches"]) == (1, GROUP_TABLE_JOBS, 1)


def test_groups_beside_single_calls_of_their_kernel_share_one_dispatch(tabled_port, rng):
    """Single calls, a group, single calls again and a second group of
    another size in one calls frame, queued behind a sleeping GPU: each
    batch they make is ONE dispatch (their rows one table), every value
    numpy's. (One batch of all 40, on an executor: the test below.)"""
    busy = tabled_port.call_async("test_hook", terms.atom("sleep_gpu"), 500)
    time.sleep(0.1)
    before = counts(tabled_port)
    sizes = [int(s) for s in rng.integers(1, 400, 5)]
    singles = [rng.integers(0, 256, s, dtype=np.uint8).tobytes() for s in sizes]
    group_a = [rng.integers(0, 256, 120, dtype=np.uint8).tobytes() for _ in range(24)]
    group_b = [rng.integers(0, 256, 37, dtype=np.uint8).tobytes() for _ in range(11)]
    first, a_ids, last, b_ids = (tabled_port.next_req_ids(n) for n in (3, 24, 2, 11))
    call = lambda r, data: terms.encode((terms.atom("call"), r, terms.atom("execute_kernel"),  # noqa: E731
                                         (terms.Binary(b"reversed"), terms.Binary(data), 1)))
    frames = [call(r, d) for r, d in zip(first, singles[:3])]
    frames.append(group_frames.encode_group(b"reversed", 1, [(r, 60000) for r in a_ids], group_a))
    frames += [call(r, d) for r, d in zip(last, singles[3:])]
    frames.append(group_frames.encode_group(b"reversed", 1, [(r, 60000) for r in b_ids], group_b))
    futures = tabled_port.call_raw_batch(frames, first + a_ids + last + b_ids)
    for data, fut in zip(singles[:3] + group_a + singles[3:] + group_b, futures):
        assert fut.result(60) == expected("reversed", data, len(data))
    busy.result(30)
    moved = delta(counts(tabled_port), before)
    assert (moved["group_jobs"], moved["table_group_jobs"], moved["table_calls"]) == (2, 2 * GROUP_TABLE_JOBS, 40)
    # However the batch sizer cut them (groups are never split), one dispatch a batch.
    assert moved["table_dispatches"] == moved["batches"] <= 3


@pytest.mark.parametrize("size,chunked", [(1024, True), (1028, True), (1025, False)], ids=["chunked", "chunked_aligned", "single_calls"])
def test_a_group_over_one_row_of_workgroups(tabled_port, rng, size, chunked):
    """reversed_one (@workgroup_size(1)) covers 65,535 words a dispatch; 64
    slots of 4 KiB outputs are 65,536. 4,096-byte outputs: two dispatches
    of 63 and 1 slots. 4,112-byte outputs: chunks of a multiple of 16 slots
    (so the next starts on a binding's 256-byte alignment), 48 and 16.
    4,100-byte outputs: a chunk must hold a multiple of 64 slots, no
    dispatch holds 64, so the group goes as its single calls (sharing
    tables of their own).
    Either way every value is numpy's."""
    before = counts(tabled_port)
    got = run_group(tabled_port, rng, "reversed_one", 64, size, 4)
    for k, (status, value, data) in enumerate(got):
        assert status == "ok", value
        assert value == expected("reversed", data, 4 * size), f"slot {k}"
    moved = delta(counts(tabled_port), before)
    assert moved["table_calls"] == 64 and moved["table_dispatches"] >= 2
    assert moved["table_group_jobs"] == int(chunked) * GROUP_TABLE_JOBS
    if chunked:
        assert moved["table_dispatches"] == 2


def test_rows_are_call_table_builds_for_slots_at_a_stride(rng):
    for _ in range(20):
        n, stride_words = int(rng.integers(1, 300)), int(rng.integers(1, 5000))
        in_bytes = int(rng.integers(1, 4 * stride_words + 1))
        out_bytes = 4 * int(rng.integers(1, 3000))
        slots = [call_table.Slot(k * 4 * stride_words, in_bytes, out_bytes) for k in range(n)]
        table = call_table.build(slots)
        assert group_table.slot_rows(n, stride_words, -(-in_bytes // 4), out_bytes // 4) == table.rows


# -- the binding limit, on an executor of the real device ----------------------------


@pytest.fixture(scope="module")
def executor():
    ex = Executor(Config(shared_table_kernels=["reversed"]), Stats())
    ex.open()
    return ex


@pytest.fixture(scope="module")
def unshared_executor():
    ex = Executor(Config(), Stats())
    ex.open()
    return ex


def group_job(source, inputs: list[bytes], out_size: int, answers: dict, live: np.ndarray | None = None) -> GroupJob:
    n = len(inputs)

    def reply_slots(blob, slots):
        for k, slot in enumerate(slots.tolist()):
            answers[slot] = bytes(blob[k * out_size : (k + 1) * out_size])

    def fail_slots(slots, error):
        for slot in slots.tolist():
            answers[slot] = error

    return GroupJob(call=KernelCall("reversed", inputs[0], out_size),
                    source=source, inputs=b"".join(inputs), slot_tags=list(range(n)),
                    deadlines=np.full(n, np.inf), live=np.ones(n, bool) if live is None else live,
                    reply_slots=reply_slots, fail_slots=fail_slots)


@pytest.mark.parametrize("limit_kib,dispatches", [(1 << 20, 1), (64, 4), (8, 32)])
def test_a_group_over_the_binding_limit_is_chunked(executor, rng, limit_kib, dispatches):
    """64 slots of 4 KiB in and out under a binding limit of 64 KiB: four
    dispatches of 16 slots (8 KiB: 32 of 2); every value numpy's, and
    an expired slot is not answered."""
    source = source_from_bytes("reversed", reversed_kernel(64).encode(), "test", "local")
    inputs = [rng.integers(0, 256, 4096, dtype=np.uint8).tobytes() for _ in range(64)]
    live = np.ones(64, bool)
    live[5] = False  # expired before it ran: its caller was answered already
    answers: dict = {}
    real = executor.gpu.binding_limit
    executor.gpu.binding_limit = min(real, limit_kib << 10)
    before = executor.stats.count("table_dispatches"), executor.stats.count("table_group_jobs")
    try:
        executor.run([group_job(source, inputs, 4096, answers, live)])
    finally:
        executor.gpu.binding_limit = real
    assert sorted(answers) == [k for k in range(64) if k != 5]
    for slot, got in answers.items():
        assert got == expected("reversed", inputs[slot], 4096), slot
    moved = executor.stats.count("table_dispatches") - before[0], executor.stats.count("table_group_jobs") - before[1]
    assert moved == (dispatches, GROUP_TABLE_JOBS)


def test_one_batch_of_single_calls_and_groups_is_one_dispatch(executor, rng):
    """Singles, a group, singles, a group of another size (and an expired
    slot) to one call-table kernel in one batch: one dispatch, 1 + 2 + ...
    rows, each caller's value numpy's."""
    source = source_from_bytes("reversed", reversed_kernel(64).encode(), "test", "local")
    answers: dict = {}
    jobs, want = [], {}
    for key, size in enumerate(int(s) for s in rng.integers(1, 500, 6)):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        out = size + int(rng.integers(0, 9))
        jobs.append(Job(KernelCall("reversed", data, out), source,
                        reply=lambda v, k=key: answers.__setitem__(k, bytes(v)), fail=lambda e, k=key: answers.__setitem__(k, e)))
        want[key] = expected("reversed", data, out)
        if key in (1, 3):  # a group after the 2nd and the 4th single
            n, size = (40, 64) if key == 1 else (7, 333)
            inputs = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]
            live = np.ones(n, bool)
            live[n // 2] = key == 1  # the second group's middle slot expired
            slots: dict = {}
            jobs.append(group_job(source, inputs, 2 * size, slots, live))
            for slot, data in enumerate(inputs):
                if live[slot]:
                    want[(key, slot)] = expected("reversed", data, 2 * size)
            answers[key, "slots"] = slots
    before = executor.stats.count("table_dispatches"), executor.stats.count("table_calls")
    executor.run(jobs)
    for key in (1, 3):
        answers.update({(key, slot): got for slot, got in answers.pop((key, "slots")).items()})
    assert answers == want
    moved = executor.stats.count("table_dispatches") - before[0], executor.stats.count("table_calls") - before[1]
    assert moved == (1, 6 + 40 + 7 - 1)  # the expired slot is not run (a metered group goes as its single calls)


@pytest.mark.parametrize("n,size,out", [(2, 4, 4), (9, 13, 26), (40, 256, 256), (17, 300, 1200)])
def test_an_unlisted_kernels_group_is_a_dispatch_per_slot(unshared_executor, rng, n, size, out):
    """By default (no kernel listed) a group of a call-table kernel is cut
    into one-slot dispatches, each bound to its own slot's input and
    output (outputs on their own aligned starts), beside single calls of
    the same kernel (each its own dispatch too); every value numpy's, an
    expired slot not answered."""
    ex = unshared_executor
    source = source_from_bytes("reversed", reversed_kernel(64).encode(), "test", "local")
    inputs = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]
    live = np.ones(n, bool)
    live[n // 2] = False
    answers: dict = {}
    single = rng.integers(0, 256, 44, dtype=np.uint8).tobytes()
    singles: list = []
    jobs = [Job(KernelCall("reversed", single, 44), source, reply=lambda v: singles.append(bytes(v)), fail=singles.append),
            group_job(source, inputs, out, answers, live)]
    before = ex.stats.count("table_dispatches"), ex.stats.count("table_calls"), ex.stats.count("table_group_jobs")
    ex.run(jobs)
    assert singles == [expected("reversed", single, 44)]
    assert sorted(answers) == [k for k in range(n) if live[k]]
    for slot, got in answers.items():
        assert got == expected("reversed", inputs[slot], out), slot
    moved = [ex.stats.count(k) - b for k, b in zip(("table_dispatches", "table_calls", "table_group_jobs"), before)]
    assert moved == [n, n, GROUP_TABLE_JOBS]  # the single and the n - 1 live slots; the expired slot is not run
