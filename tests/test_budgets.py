"""Budgets (issue 13, Build 4, Python half): a port holds a bounded number
of calls and bytes, counting calls that wait on a gateway fetch; beyond
that callers hear ``overloaded`` at once."""

from __future__ import annotations

import time
from concurrent.futures import wait

import numpy as np
import pytest

from arweave_fixture import Gateway, make_tx, new_key
from conftest import sent, start_port, wait_running
from kem_port.wire import terms
from kem_port.port.budget import WorkBudget
from kem_port.client import PortError
from kem_port.errors import KemError
from kem_port.kernel_store import PACKAGED_KERNELS


def test_work_budget_counts_calls_and_bytes():
    budget = WorkBudget(max_calls=3, max_bytes=100)
    budget.take(60)
    with pytest.raises(KemError) as err:
        budget.take(50)
    assert err.value.reason == "overloaded"
    budget.take(40)
    budget.give(60)
    budget.take(10)
    budget.take(1)
    with pytest.raises(KemError):
        budget.take(1)  # three calls held
    budget.give(40)
    budget.give(10)
    budget.give(1)
    assert budget.describe() == {"held_calls": 0, "held_bytes": 0}
    budget.take(10_000)  # a lone call larger than the byte budget still runs
    budget.give(10_000)


def test_queue_bytes_bound_what_waits(rng):
    with start_port(KEM_QUEUE_BYTES=str(1 << 20)) as port:
        hold_id, _ = sent(port, "test_hook", terms.atom("sleep_gpu"), 1500)  # occupy the GPU thread
        wait_running(port, hold_id)
        inputs = [rng.integers(0, 2**32, (256 << 10) // 4, dtype=np.uint32) for _ in range(6)]
        calls = [port.call_async("execute_kernel", b"double", words.tobytes(), 1) for words in inputs]
        wait(calls, timeout=60)
        served = [(w, f) for w, f in zip(inputs, calls) if f.exception() is None]
        refused = [f for f in calls if f.exception() is not None]
        assert len(served) == 4 and len(refused) == 2  # 4 x 256 KiB fill 1 MiB
        assert all(f.exception().reason == "overloaded" for f in refused)
        for words, fut in served:
            assert fut.result() == (words * np.uint32(2)).tobytes()
        assert port.call("stats")[terms.atom("held_calls")] == 0


def test_calls_waiting_on_a_fetch_count_in_the_queue_limit(tmp_path, rng):
    key, gateway = new_key(), Gateway()
    try:
        double = (PACKAGED_KERNELS / "double.wgsl").read_bytes()
        slow = [make_tx(key, double, [(b"wait", str(i).encode())]) for i in range(4)]
        for header in slow:
            gateway.publish_tx(header, double)
            gateway.routes[f"/tx/{header['id']}"].delay_s = 3
        with start_port(KEM_QUEUE_LIMIT="4", KEM_GATEWAYS=gateway.url, KEM_CACHE_DIR=str(tmp_path / "cache"),
                        KEM_FETCH_TIMEOUT_MS="10000") as port:
            waiting = [port.call_async("execute_kernel", h["id"].encode(), b"abcd", 1) for h in slow]
            time.sleep(0.5)
            with pytest.raises(PortError) as err:
                port.call("execute_kernel", b"double", b"abcd", 1)
            assert err.value.reason == "overloaded"
            wait(waiting, timeout=60)
            for f in waiting:
                assert f.result() == (np.frombuffer(b"abcd", np.uint32) * np.uint32(2)).tobytes()
            words = rng.integers(0, 2**32, 64, dtype=np.uint32)
            assert port.call("execute_kernel", b"double", words.tobytes(), 1) == (words * np.uint32(2)).tobytes()
    finally:
        gateway.close()
