"""The executor in-process on the real adapter: a stream of batches through
Executor.step, each encoded while the one before it computes."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.executor import Executor
from kem_port.gpu.calls import Job
from kem_port.kernel_store import KernelSource, default_stores, source_from_bytes
from kem_port.gpu.calls import KernelCall
from kem_port.stats import Stats


@pytest.fixture(scope="module", params=[0, 2000], ids=["blocking-wait", "spin-then-wait"])
def executor(request):
    """Both ways of waiting for the GPU (gpu_wait.py), whatever the adapter."""
    ex = Executor(Config(poll_spin_us=request.param), Stats())
    ex.open()
    assert ex.spin_s == request.param / 1e6
    return ex


class Answers:
    """Every answer a job gets; a job must get exactly one."""

    def __init__(self) -> None:
        self.got: dict[int, list] = {}

    def job(self, key: int, call: KernelCall, source: KernelSource | None = None) -> Job:
        source = source or default_stores(None)[0].lookup(call.kernel_id)
        self.got[key] = []
        return Job(call, source, reply=lambda v, k=key: self.got[k].append(bytes(v)),
                   fail=lambda e, k=key: self.got[k].append(e))


def test_step_lands_the_previous_batch_and_leaves_the_new_one_in_flight(executor, rng):
    answers = Answers()
    data = [rng.integers(0, 256, 64, dtype=np.uint8).tobytes() for _ in range(6)]
    first = [answers.job(i, KernelCall("double", data[i], 64)) for i in range(3)]
    second = [answers.job(i, KernelCall("double", data[i], 64)) for i in range(3, 6)]
    flight = executor.step(None, first)
    assert flight is not None and all(answers.got[i] == [] for i in range(3))
    flight = executor.step(flight, second)
    assert all(answers.got[i] == [reference.double(data[i], 64)] for i in range(3))
    assert flight is not None and all(answers.got[i] == [] for i in range(3, 6))
    assert executor.step(flight, []) is None
    assert all(answers.got[i] == [reference.double(data[i], 64)] for i in range(3, 6))


def test_an_overlapped_stream_matches_numpy_and_answers_each_call_once(executor, rng):
    answers = Answers()
    expected: dict[int, bytes | str] = {}
    flight = None
    key = 0
    for _ in range(12):
        batch = []
        for _ in range(int(rng.integers(1, 20))):
            size = int(rng.choice([1, 4, 333, 4096, 70_000, 300_001]))
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            if rng.random() < 0.1:  # fails alone, in preparation
                batch.append(answers.job(key, KernelCall("double", data, 8, params=b"\0" * 16)))
                expected[key] = "bad_args"
            else:
                out = int(rng.integers(1, 2 * size + 2))
                batch.append(answers.job(key, KernelCall("double", data, out)))
                expected[key] = reference.double(data, out)
            key += 1
        flight = executor.step(flight, batch)
    while flight is not None:
        flight = executor.step(flight, [])
    for k, want in expected.items():
        assert len(answers.got[k]) == 1, k
        got = answers.got[k][0]
        if isinstance(want, str):
            assert isinstance(got, KemError) and got.reason == want
        else:
            assert got == want, k


FIXED_INPUT = b"""
@group(0) @binding(0) var<storage, read> input_words: array<u32, 64>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&output_words)) { output_words[id.x] = input_words[id.x % 64u]; }
}
"""


def test_a_batch_that_fails_as_a_whole_is_retried_call_by_call(executor, rng):
    """A binding smaller than the kernel's fixed array passes every check
    kem makes and fails only when wgpu validates the encoded batch: the
    batch is then run call by call, so only that call fails, and the batch
    still in flight before it is answered first."""
    fixed = source_from_bytes("fixed_input", FIXED_INPUT, "test", "local")
    answers = Answers()
    data = [rng.integers(0, 256, 256, dtype=np.uint8).tobytes() for _ in range(5)]
    ahead = executor.step(None, [answers.job(0, KernelCall("double", data[0], 256))])
    batch = [
        answers.job(1, KernelCall("double", data[1], 256)),
        answers.job(2, KernelCall("fixed_input", data[2][:4], 256), fixed),
        answers.job(3, KernelCall("fixed_input", data[3], 256), fixed),
        answers.job(4, KernelCall("double", data[4], 256)),
    ]
    flight = executor.step(ahead, batch)
    while flight is not None:
        flight = executor.step(flight, [])
    assert answers.got[0] == [reference.double(data[0], 256)]
    assert answers.got[1] == [reference.double(data[1], 256)]
    assert len(answers.got[2]) == 1 and isinstance(answers.got[2][0], KemError)
    assert answers.got[2][0].reason == "gpu_error", answers.got[2][0]
    assert "binding" in str(answers.got[2][0]).lower(), answers.got[2][0]
    assert answers.got[3] == [data[3]]
    assert answers.got[4] == [reference.double(data[4], 256)]


@pytest.mark.parametrize("words", [1, 7, 1000])
def test_a_lone_call_waits_with_the_lone_spin_and_matches_numpy(rng, words):
    """A call the reader runs alone (gpu_loop.run_inline) spins before its
    blocking wait even on a CPU adapter, where batches do not; an explicit
    KEM_POLL_SPIN_US sets both."""
    ex = Executor(Config(), Stats())
    ex.open()
    cpu = ex.info["adapter_type"] == "CPU"
    assert ex.gpu.lone_spin_s == (0.0001 if cpu else 0.002)
    assert ex.spin_s == (0.0 if cpu else 0.002)
    answers = Answers()
    data = rng.integers(0, 2**32, words, dtype=np.uint32).tobytes()
    flight = ex.step(None, [answers.job(0, KernelCall("double", data, len(data)))], lone=True)
    assert flight is not None and flight.spin_s == ex.gpu.lone_spin_s
    assert ex.step(flight, []) is None
    assert answers.got[0] == [(np.frombuffer(data, dtype=np.uint32) * 2).astype(np.uint32).tobytes()]
    batch = ex.step(None, [answers.job(1, KernelCall("double", data, len(data)))])
    assert batch is not None and batch.spin_s == ex.spin_s
    assert ex.step(batch, []) is None and answers.got[1] == answers.got[0]
    explicit = Executor(Config(poll_spin_us=123), Stats())
    explicit.open()
    assert explicit.gpu.lone_spin_s == explicit.spin_s == 123e-6


@pytest.mark.parametrize("size", [4096, 64 * 1024, 64 * 1024 + 256, 300_000])
def test_a_pooled_output_is_zeroed_on_both_sides_of_the_zero_write_limit(executor, rng, size):
    """Outputs up to batch.ZERO_WRITE_LIMIT are zeroed by a queue write,
    larger ones by a clear: either way a kernel that writes only its first
    256 words (one workgroup) leaves zeros, not an earlier caller's bytes."""
    from kem_port.gpu.batch import ZERO_WRITE_LIMIT

    assert ZERO_WRITE_LIMIT == 64 * 1024
    answers = Answers()
    secret = rng.integers(1, 256, size, dtype=np.uint8).tobytes()
    executor.run([answers.job(0, KernelCall("double", secret, size))])
    assert answers.got[0] == [reference.double(secret, size)]
    executor.run([answers.job(1, KernelCall("double", bytes(size), size, workgroups=(1, 1, 1)))])
    assert answers.got[1] == [bytes(size)]


def test_a_wait_that_ends_in_a_blocking_poll_is_counted(executor, rng):
    """gpu_waits_blocked counts batches whose wait had to block: every one
    without a spin (a map completes only in a poll), at most every one with."""
    answers = Answers()
    before = executor.stats.count("gpu_waits_blocked")
    for key in range(3):
        data = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        executor.run([answers.job(key, KernelCall("double", data, 64))])
        assert answers.got[key] == [reference.double(data, 64)]
    blocked = executor.stats.count("gpu_waits_blocked") - before
    assert blocked == 3 if executor.spin_s == 0 else 0 <= blocked <= 3


def test_a_batch_counts_its_bytes_once_per_batch_in_stats(executor, rng):
    """bytes_in / bytes_out (summed per batch, one stats update each) are the
    callers' input and output sizes, small results and large alike."""
    answers = Answers()
    sizes = [4, 333, 4096, 70_000, 300_001]
    data = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    before_in, before_out = executor.stats.count("bytes_in"), executor.stats.count("bytes_out")
    executor.run([answers.job(k, KernelCall("double", d, 2 * len(d))) for k, d in enumerate(data)])
    for k, d in enumerate(data):
        assert answers.got[k] == [reference.double(d, 2 * len(d))]
    assert executor.stats.count("bytes_in") - before_in == sum(sizes)
    assert executor.stats.count("bytes_out") - before_out == 2 * sum(sizes)
