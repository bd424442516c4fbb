"""The lone kit road (gpu/lone_road.py, gpu/lone_kit.py) in-process on the real adapter: a
lone call on its shape's kit gives numpy's answer, zeroes its output every
call, keeps every check, is never run twice at once, and fails by the
executor's rules (device loss rebuilds and empties the kits)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

import reference
import test_executor
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu import lone_road
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.port.gpu_loop import GpuLoop
from kem_port.kernel_store import KernelSource, default_stores, source_from_bytes
from kem_port.stats import Stats

# Writes output word k only where input word k is not zero.
SPARSE = source_from_bytes("sparse", b"""
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let k = id.x;
    if (k < arrayLength(&output_words) && input_words[k] != 0u) { output_words[k] = input_words[k] + 1u; }
}
""", "test", "local")

# An input binding smaller than this array passes kem's checks and fails in wgpu's validation.
FIXED_INPUT = source_from_bytes("fixed_input", test_executor.FIXED_INPUT, "test", "local")


@pytest.fixture(scope="module")
def executor():
    ex = Executor(Config(), Stats())
    ex.open()
    return ex


def packaged(kernel_id: str) -> KernelSource:
    return default_stores(None)[0].lookup(kernel_id)


class Answer:
    """What one job was answered (exactly once)."""

    def __init__(self) -> None:
        self.got: list = []

    def job(self, call: KernelCall, source: KernelSource | None = None) -> Job:
        return Job(call, source or packaged(call.kernel_id), reply=lambda v: self.got.append(bytes(v)), fail=self.got.append)

    @property
    def value(self):
        assert len(self.got) == 1, self.got
        return self.got[0]


def run_lone(ex: Executor, call: KernelCall, source: KernelSource | None = None):
    answer = Answer()
    assert ex.run_lone(answer.job(call, source)) is True
    return answer.value


@pytest.mark.parametrize("size", [1, 3, 4, 7, 64, 1001, 4096, 64 * 1024 // 2])
def test_a_lone_call_on_its_kit_matches_numpy_and_reuses_the_kit(executor, rng, size):
    built = executor.stats.count("lone_kits_built")
    calls = executor.stats.count("lone_kit_calls")
    for _ in range(3):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert run_lone(executor, KernelCall("double", data, 2 * size)) == reference.double(data, 2 * size)
    assert executor.stats.count("lone_kits_built") - built <= 1  # one kit for the shape, at most (a test before may have made it)
    assert executor.stats.count("lone_kit_calls") - calls == 3


def test_a_kit_with_params_plans_its_dispatch_from_each_calls_params(executor, rng):
    """glitch's workgroups come from the params' width and height: two
    images of one byte size but different shapes share a kit and each is
    dispatched for its own shape. (Not pixelize: its block loops keep it
    off the reader, so it gets no kit: inline_call.may_run_inline.)"""
    for width, height, seed in ((16, 4, 2), (4, 16, 3), (8, 8, 1), (16, 4, 5)):
        image = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        params = np.array([width, height, seed, 3], dtype="<u4").tobytes()
        got = run_lone(executor, KernelCall("glitch", image.tobytes(), image.nbytes, params=params))
        assert got == reference.glitch(image, seed, 3).tobytes()
    image = rng.integers(0, 256, (4, 16, 4), dtype=np.uint8)
    too_big = np.array([1000, 1000, 1, 0], dtype="<u4").tobytes()  # more pixels than the output has bytes
    got = run_lone(executor, KernelCall("glitch", image.tobytes(), image.nbytes, params=too_big))
    assert isinstance(got, KemError) and got.reason == "too_large"


def test_a_kernel_that_may_loop_gets_no_kit(executor, rng):
    image = rng.integers(0, 256, (4, 16, 4), dtype=np.uint8)
    params = np.array([16, 4, 2, 0], dtype="<u4").tobytes()
    assert executor.run_lone(Answer().job(KernelCall("pixelize", image.tobytes(), image.nbytes, params=params))) is False


def test_a_kit_zeroes_its_output_on_every_call(executor, rng):
    """A kernel that writes only some outputs returns zeros elsewhere, not
    the bytes the same kit's previous call left there."""
    words = 512
    full = rng.integers(1, 2**31, words, dtype=np.uint32)
    assert run_lone(executor, KernelCall("sparse", full.tobytes(), 4 * words), SPARSE) == (full + 1).tobytes()
    sparse = full.copy()
    sparse[rng.random(words) < 0.5] = 0
    want = np.where(sparse != 0, sparse + 1, 0).astype(np.uint32).tobytes()
    assert run_lone(executor, KernelCall("sparse", sparse.tobytes(), 4 * words), SPARSE) == want
    assert run_lone(executor, KernelCall("sparse", bytes(4 * words), 4 * words), SPARSE) == bytes(4 * words)


def test_a_call_that_breaks_a_check_is_refused_and_leaves_no_kit(executor, rng):
    kits = len(executor.lone)
    short = KernelCall("pixelize", bytes(64), 64, params=bytes(4))  # its uniform is 16 bytes
    got = run_lone(executor, short)
    assert isinstance(got, KemError) and got.reason == "bad_args"
    got = run_lone(executor, KernelCall("double", bytes(8), 8, params=bytes(16)))  # double reads no params
    assert isinstance(got, KemError) and got.reason == "bad_args"
    assert len(executor.lone) == kits
    data = rng.integers(0, 256, 12, dtype=np.uint8).tobytes()
    assert run_lone(executor, KernelCall("double", data, 12)) == reference.double(data, 12)


def test_a_gpu_error_is_the_callers_own_and_drops_the_kit(executor, rng):
    """wgpu's validation refuses the binding: that caller gets gpu_error
    with wgpu's message, the failing kit is not kept, and the next call
    (its own kit) is answered."""
    kits = len(executor.lone)
    got = run_lone(executor, KernelCall("fixed_input", bytes(4), 256), FIXED_INPUT)
    assert isinstance(got, KemError) and got.reason == "gpu_error", got
    assert "binding" in str(got).lower(), got
    assert len(executor.lone) == kits
    data = rng.integers(0, 256, 256, dtype=np.uint8).tobytes()
    assert run_lone(executor, KernelCall("fixed_input", data, 256), FIXED_INPUT) == data
    assert executor.stats.count("device_rebuilds") == 0


def test_calls_no_kit_takes_go_to_the_batch_road(executor):
    """Too large, explicit workgroups, a call-table kernel: run_lone does
    nothing and answers nothing (the caller runs the batch road)."""
    answer = Answer()
    for call in (
        KernelCall("double", bytes(64 * 1024 + 4), 64 * 1024 + 4),
        KernelCall("double", bytes(64), 64, workgroups=(1, 1, 1)),
        KernelCall("double_table", bytes(64), 64),
        KernelCall("double", bytes(64), 0),
    ):
        assert executor.run_lone(answer.job(call)) is False
        assert executor.run_lone(answer.job(call)) is False  # the call-table shape is remembered as none
    assert answer.got == []


def test_the_kits_are_few_and_the_oldest_goes(rng):
    ex = Executor(Config(), Stats())
    ex.open()
    for size in range(4, 4 * (lone_road.KITS + 5), 4):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert run_lone(ex, KernelCall("double", data, size)) == reference.double(data, size)
    assert len(ex.lone) == lone_road.KITS
    assert ex.stats.count("lone_kits_built") == lone_road.KITS + 4


def test_wgpu_pys_objects_take_the_batch_road(rng):
    ex = Executor(Config(hot_path="wrappers"), Stats())
    ex.open()
    answer = Answer()
    assert ex.run_lone(answer.job(KernelCall("double", bytes(4), 4))) is False
    assert answer.got == [] and len(ex.lone) == 0


def test_device_loss_on_the_kit_road_rebuilds_and_empties_the_kits(rng):
    ex = Executor(Config(), Stats())
    ex.open()
    data = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    assert run_lone(ex, KernelCall("double", data, 64)) == reference.double(data, 64)
    assert len(ex.lone) == 1
    old = ex.gpu.device
    ex.destroy_device_for_test()
    got = run_lone(ex, KernelCall("double", data, 64))
    assert isinstance(got, KemError) and got.reason == "device_lost", got
    assert ex.stats.count("device_rebuilds") == 1 and ex.gpu.device is not old
    assert len(ex.lone) == 0
    # The next lone call compiles again on the new device (as the batch road
    # would: run_inline sends it there while the kernel is not compiled).
    answer = Answer()
    flight = ex.step(None, [answer.job(KernelCall("double", data, 64))], lone=True)
    ex.step(flight, [])
    assert answer.value == reference.double(data, 64)
    assert run_lone(ex, KernelCall("double", data, 64)) == reference.double(data, 64)
    assert len(ex.lone) == 1


def test_a_second_caller_while_the_road_is_busy_takes_the_batch_road(executor):
    """The road's own lock, taken without waiting: whoever reaches the kits
    while a call is on them is sent to the batch road, never onto them."""
    answer = Answer()
    assert executor.lone._busy.acquire(blocking=False)
    try:
        assert executor.run_lone(answer.job(KernelCall("double", bytes(4), 4))) is False
    finally:
        executor.lone._busy.release()
    assert answer.got == []


def run_inline(loop: GpuLoop, job: Job) -> bool:
    """What the reader's lone road (port/lone_call.py) does around a call
    it runs: the executor's lock without waiting, an empty queue, then
    GpuLoop.run_held; False (nothing done) when the call must queue."""
    if not loop.executor_lock.acquire(blocking=False):
        return False
    try:
        if loop.queue.queue:
            return False
        loop.inline_tag = job.tag
        loop.run_held(job)
        return True
    finally:
        loop.inline_tag = None
        loop.executor_lock.release()


def test_lone_calls_from_many_threads_never_share_a_kit(rng, monkeypatch):
    """Eight threads call run_inline (as readers would) while the GPU
    thread runs the calls that queue: each is answered once with numpy's
    answer, and no two calls were ever on the kits at once."""
    ex = Executor(Config(), Stats())
    ex.open()
    loop = GpuLoop(ex, 10_000, 64, contextlib.nullcontext)
    loop.start()
    inside, most = [0], [0]
    count_lock = threading.Lock()
    real_run = lone_road.LoneRoad._run

    def counted(self, job, call):  # the real call, counted while inside
        with count_lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            return real_run(self, job, call)
        finally:
            with count_lock:
                inside[0] -= 1

    monkeypatch.setattr(lone_road.LoneRoad, "_run", counted)
    source = packaged("double")
    warm = Answer()
    ex.run([warm.job(KernelCall("double", bytes(16), 16))])  # compiled: calls may run inline
    answered = threading.Semaphore(0)
    results: list[tuple[bytes, list]] = []

    def caller(seed: int) -> None:
        local = np.random.default_rng(seed)
        for _ in range(40):
            size = int(local.choice([4, 16, 100]))
            data = local.integers(0, 256, size, dtype=np.uint8).tobytes()
            got: list = []

            def reply(view, got=got):
                got.append(bytes(view))
                answered.release()

            def fail(error, got=got):
                got.append(error)
                answered.release()

            job = Job(KernelCall("double", data, size), source, reply=reply, fail=fail)
            results.append((data, got))
            if not run_inline(loop, job):
                loop.put(job)

    threads = [threading.Thread(target=caller, args=(int(rng.integers(2**32)),)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _ in results:
        assert answered.acquire(timeout=60)
    assert all(got == [reference.double(data, len(data))] for data, got in results)
    assert most[0] == 1
    assert ex.stats.count("lone_kit_calls") > 0
