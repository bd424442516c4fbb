"""Stateless chains of one shape, queued behind each other, run in one
submission (port/chain_gather.py, gpu/session/chain_batch.py): each on its
own kit, answered with its own values (numpy), none seeing another's
bytes, through the real port on the real adapter."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import session_port

from kem_port.client import PortError
from kem_port.wire import terms

TEN = [{"kernel": "double"}] * 10


@pytest.fixture(scope="module")
def port():
    with session_port() as client:
        yield client


def _bytes(value) -> bytes:
    """A binary as the client gives it: bytes alone, an OtpErlangBinary inside a map."""
    return value if isinstance(value, bytes) else terms.binary_bytes(value)


def _stat(port, name: str) -> int:
    return port.call("stats").get(terms.atom(name), 0)


def _queued_behind_a_busy_gpu(port, calls: list[tuple]) -> list:
    """Send every chain while the GPU thread sleeps: they queue together."""
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), 600)
    pending = [port.call_async("chain", terms.atom("undefined"), steps, opts) for steps, opts in calls]
    busy.result(30)
    return pending


@pytest.mark.parametrize("n", [1, 100, 1024])
def test_queued_chains_of_one_shape_share_a_submission_each_with_its_own_values(port, rng, n):
    for _ in range(2):  # planned, then its kit: a repeat takes the kit
        port.chain(TEN, input=rng.integers(0, 2**32, n, dtype=np.uint32).tobytes())
    batches, runs = _stat(port, "chain_batches"), _stat(port, "chain_kit_runs")
    inputs = [rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(6)]  # five replicas of the kit
    pending = _queued_behind_a_busy_gpu(port, [(TEN, {"input": x.tobytes()}) for x in inputs])
    for x, got in zip(inputs, pending):
        assert np.array_equal(np.frombuffer(_bytes(got.result(60)), "<u4"), x * np.uint32(1024))
    assert _stat(port, "chain_batches") >= batches + 1
    assert _stat(port, "chain_kit_runs") == runs + len(inputs)


def test_named_results_and_usage_come_back_per_chain(port, rng):
    """A shape that returns named buffers and asks for its gas: each chain its own."""
    steps = [{"kernel": "double", "output": "a"}, {"kernel": "double", "input": "a", "output": "b"}]
    opts = lambda x: {"input": x.tobytes(), "return": ["a", "b"], "usage": True}  # noqa: E731
    for _ in range(2):
        port.call("chain", terms.atom("undefined"), steps, opts(rng.integers(0, 2**32, 64, dtype=np.uint32)))
    batches = _stat(port, "chain_batches")
    inputs = [rng.integers(0, 2**32, 64, dtype=np.uint32) for _ in range(4)]
    pending = _queued_behind_a_busy_gpu(port, [(steps, opts(x)) for x in inputs])
    for x, got in zip(inputs, pending):
        value, usage = got.result(60)
        named = {_bytes(k).decode(): np.frombuffer(_bytes(v), "<u4") for k, v in value.items()}
        assert np.array_equal(named["a"], x * np.uint32(2)) and np.array_equal(named["b"], x * np.uint32(4))
        assert usage[terms.atom("gas")] == 2 * 256  # loop-free: what it launched, a workgroup of 256 a step
    assert _stat(port, "chain_batches") >= batches + 1


def test_a_session_chain_is_never_gathered(port, rng):
    """Chains in a session keep their own road (its buffers are the session's)."""
    s = port.session_open()
    s.create("acc", bytes(64))
    steps = [{"kernel": "double", "output": "acc"}]
    for _ in range(2):
        s.chain(steps, input=bytes(64))
    batches = _stat(port, "chain_batches")
    inputs = [rng.integers(0, 2**32, 16, dtype=np.uint32) for _ in range(3)]
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), 400)
    pending = [port.call_async("chain", s.ref, steps, {"input": x.tobytes(), "return": ["acc"]}) for x in inputs]
    busy.result(30)
    for x, got in zip(inputs, pending):
        value = got.result(60)
        assert np.array_equal(np.frombuffer(_bytes(value[terms.Binary(b"acc")]), "<u4"), x * np.uint32(2))
    assert _stat(port, "chain_batches") == batches
    s.close()


def test_a_bad_chain_queued_among_good_ones_is_answered_alone(port, rng):
    x = rng.integers(0, 2**32, 8, dtype=np.uint32)
    for _ in range(2):
        port.chain(TEN, input=x.tobytes())
    calls = [(TEN, {"input": x.tobytes()}), ([{"kernel": "no_such_kernel"}], {"input": x.tobytes()}), (TEN, {"input": x.tobytes()})]
    pending = _queued_behind_a_busy_gpu(port, calls)
    with pytest.raises(PortError) as err:
        pending[1].result(60)
    assert err.value.reason == "kernel_not_found"
    for got in (pending[0], pending[2]):
        assert np.array_equal(np.frombuffer(_bytes(got.result(60)), "<u4"), x * np.uint32(1024))
