"""The road a session step or chain takes (docs/sessions.md, "The road a
step takes"): a short loop-free step runs on the reader, and a step whose
dispatch, loop or bytes make it long runs on the GPU thread, each answered
with values checked against numpy on fresh random data, through a real port."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import start_port

from kem_port.wire import terms

KERNELS = str(Path(__file__).resolve().parent / "session_kernels")


@pytest.fixture(scope="module")
def sport():
    with start_port(KEM_KERNEL_DIR=KERNELS) as client:
        yield client


def counters(port) -> dict:
    return {terms.atom_name(k): v for k, v in port.call("stats").items()}


def moved(port, before: dict, *names: str) -> tuple[int, ...]:
    after = counters(port)
    return tuple(after.get(n, 0) - before.get(n, 0) for n in names)


@pytest.mark.parametrize("n", [16, 1000, 4000])
def test_small_resident_steps_run_on_the_reader(sport, rng, n):
    start = rng.integers(0, 2**32, n, dtype=np.uint32)
    s = sport.session_open()
    s.create("acc", start.tobytes())
    s.call("accumulate", bytes(4), output_size=0)  # compiled first: a compile never runs on the reader
    before, expected = counters(sport), start.copy()
    for _ in range(12):
        step = rng.integers(0, 2**32, int(rng.integers(1, n + 1)), dtype=np.uint32)
        expected = expected + np.resize(step, n)  # acc[i] += input[i mod len(input)], u32 wrap
        assert s.call("accumulate", step.tobytes(), output_size=0) == b""
    assert moved(sport, before, "inline_session_calls", "session_calls_off_reader") == (12, 0)
    assert np.array_equal(np.frombuffer(s.read("acc"), "<u4"), expected)
    s.close()


@pytest.mark.parametrize("n", [1, 333, 1024])  # 11 buffers of 4n bytes: within 64 KiB
def test_small_chains_run_on_the_reader(sport, rng, n):
    data = rng.integers(0, 2**32, n, dtype=np.uint32)
    steps = [{"kernel": "double"}] * 10
    sport.chain(steps, input=data.tobytes())
    before = counters(sport)
    for _ in range(3):
        data = rng.integers(0, 2**32, n, dtype=np.uint32)
        out = np.frombuffer(sport.chain(steps, input=data.tobytes()), "<u4")
        assert np.array_equal(out, data * np.uint32(1024))
    assert moved(sport, before, "inline_session_calls", "session_calls_off_reader") == (3, 0)


@pytest.mark.parametrize("groups", [1024, 4096])
def test_a_wide_dispatch_leaves_the_reader(sport, rng, groups):
    """A 4-byte step on a 4 KB state whose workgroups the caller sets past a
    lone call's work (64 x 1024 invocations > 16,384) runs on the GPU thread:
    on the reader, {4096, 256, 1} would hold ping and call_state for as long
    as the GPU runs it."""
    start = rng.integers(0, 2**32, 1024, dtype=np.uint32)
    s = sport.session_open()
    s.create("acc", start.tobytes())
    s.call("accumulate", bytes(4), output_size=0)
    one = rng.integers(0, 2**32, 1, dtype=np.uint32)
    before = counters(sport)
    assert s.call("accumulate", one.tobytes(), output_size=0, workgroups=(groups, 1, 1)) == b""
    assert moved(sport, before, "inline_session_calls", "session_calls_off_reader") == (0, 1)
    assert np.array_equal(np.frombuffer(s.read("acc"), "<u4"), start + one[0])
    s.close()


def test_a_looping_kernel_never_runs_on_the_reader(sport, rng):
    """spin loops until its input's word 0 is 12345: given it, no turn is
    taken; still a kernel that may loop, so it stays on the GPU thread."""
    data = np.array([12345] + list(rng.integers(0, 2**32, 15, dtype=np.uint32)), dtype="<u4")
    sport.chain([{"kernel": "spin"}], input=data.tobytes())
    before = counters(sport)
    out = sport.chain([{"kernel": "spin"}], input=data.tobytes())
    assert np.array_equal(np.frombuffer(out, "<u4"), np.zeros(16, "<u4"))
    assert moved(sport, before, "inline_session_calls") == (0,)


def test_a_large_state_stays_off_the_reader(sport, rng):
    n = 32 * 1024  # 128 KiB of state: over a lone call's 64 KiB
    start = rng.integers(0, 2**32, n, dtype=np.uint32)
    s = sport.session_open()
    s.create("acc", start.tobytes())
    step = rng.integers(0, 2**32, 8, dtype=np.uint32)
    s.call("accumulate", step.tobytes(), output_size=0)
    before = counters(sport)
    s.call("accumulate", step.tobytes(), output_size=0)
    assert moved(sport, before, "inline_session_calls") == (0,)
    assert np.array_equal(np.frombuffer(s.read("acc"), "<u4"), start + 2 * np.resize(step, n))
    s.close()
