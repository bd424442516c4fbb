"""A stuck batch is blamed on the right call (gpu/blame.py): a kernel that
may loop shares a batch only with its own calls, and the batch encoded
behind the one in flight is queued, not running. The second red team of
issue 24 got `double` quarantined (its port killed) by sending a runaway
50 ms after an innocent call while the GPU thread was busy: both landed in
one batch, and call_state answered `running` for both."""

from __future__ import annotations

import queue
import time

import numpy as np
from test_request_budgets import RUNAWAY, SPIN, SPIN_HINT, port_killed_after, spin_input, spin_reference

from kem_port.wire import terms
from kem_port.gpu.calls import Job, KernelCall
from kem_port.port.gpu_loop import _take_batch
from kem_port.kernel_store import PACKAGED_KERNELS, source_from_bytes
from conftest import call_state, sent, wait_running


def _job(source, tag: int) -> Job:
    return Job(KernelCall(source.kernel_id, b"\0" * 16, 16), source, reply=lambda _v: None, fail=lambda _e: None, tag=tag)


def test_a_kernel_that_may_loop_is_batched_only_with_its_own_calls():
    double = source_from_bytes("double", (PACKAGED_KERNELS / "double.wgsl").read_bytes(), "packaged", "local")
    spin = source_from_bytes("spin", SPIN.encode(), "test", "local")
    other = source_from_bytes("spin2", SPIN.replace("x ^= x << 13u", "x ^= x << 12u").encode(), "test", "local")
    order = [double, double, spin, spin, double, other, spin]
    q: queue.Queue = queue.Queue()
    for tag, source in enumerate(order[1:], start=1):
        q.put(_job(source, tag))
    batches = [[j.call.kernel_id for j in _take_batch(q, _job(order[0], 0), 64, 1 << 30)[0]]]
    while not q.empty():
        batches.append([j.call.kernel_id for j in _take_batch(q, q.get(), 64, 1 << 30)[0]])
    assert batches == [["double", "double"], ["spin", "spin"], ["double"], ["spin2"], ["spin"]]


def test_an_innocent_call_batched_before_a_runaway_is_not_running(kernel_dir, rng):
    (kernel_dir / "spin.wgsl").write_text(SPIN)
    with port_killed_after(KEM_KERNEL_DIR=str(kernel_dir), KEM_TEST_HOOKS="1") as port:
        seed = int(rng.integers(0, 2**31))
        assert port.call("execute_kernel", b"spin", spin_input(3, seed), SPIN_HINT) == spin_reference(3, seed, 16 * SPIN_HINT // 4)
        words = rng.integers(0, 2**31, int(rng.integers(1, 4000)), dtype=np.uint32)
        port.call("execute_kernel", b"double", words.tobytes(), 1)
        hold_id, hold = sent(port, "test_hook", terms.atom("sleep_gpu"), 800)
        wait_running(port, hold_id)  # the GPU thread is asleep: what comes now queues together
        innocent_id = port.next_req_ids(1)[0]
        innocent = port.call_raw_frame(terms.encode(port._request(innocent_id, "execute_kernel", (b"double", words.tobytes(), 1), 600_000)), [innocent_id])[0]
        time.sleep(0.05)
        runaway_id = port.next_req_ids(1)[0]
        runaway = port.call_raw_frame(terms.encode(port._request(runaway_id, "execute_kernel", (b"spin", spin_input(RUNAWAY, 7), SPIN_HINT), 600_000)), [runaway_id])[0]
        hold.result(30)
        assert innocent.result(30) == (words * 2).astype("<u4").tobytes()  # its own batch, answered
        wait_running(port, runaway_id)
        assert not runaway.done()
        assert call_state(port, innocent_id) != "running"
