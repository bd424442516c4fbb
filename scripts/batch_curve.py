#!/usr/bin/env python3
"""Calls/s of the executor alone against batch size (small double calls),
in-process, so the port and pipes are out of the picture: the curve that
sets KEM_MAX_BATCH's default. Each size is run two ways in the same process:
batches one after another (`run`: encode, submit, wait, deliver) and as a
stream (`step`: each batch encoded while the previous one computes and
delivered while the next one does), so the overlap's gain is a ratio.

``--stages N`` instead streams batches of N small calls through
Executor.step and prints the host time a call spends in each of the
executor's own stages (prepare, encode, submit, wait, read, answer; each
method timed once per batch, so the timer costs nothing per call) and in
the landed batch's cost() that the GPU loop's batch sizer reads, three
rounds; every result is checked against numpy. The figure to cut per-call
Python on the GPU thread by (issue 14).

``--drain N`` times the GPU thread taking a batch of N queued jobs off its
queue (GpuLoop._drain and _unexpired; no GPU), in microseconds a job.

``--port N`` puts the whole port around it, in this process: a real Router
fed calls frames of N execute_kernel requests (as the node batches N
callers), each frame once the previous one's calls are answered, replies
written by a FrameWriter to /dev/null (their values are --stages' to
check). Prints calls/s, calls a batch and the GPU thread's own CPU time a
call (its thread clock), split into its stages and the reply callbacks.
Usage: python scripts/batch_curve.py [out.json] | --stages N [--rounds R] | --drain N | --port N [--rounds R]"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time

import numpy as np

from kem_port.config import Config
from kem_port.gpu.executor import Executor
from kem_port.gpu.calls import Job
from kem_port.kernel_store import default_stores
from kem_port.gpu.calls import KernelCall
from kem_port.stats import Stats

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


STAGES = ("upload_encode", "submit", "gpu_wait", "readback", "gpu_kernel")


def _stage_us(before: dict, after: dict, batches: int) -> dict[str, float]:
    """Mean microseconds a batch spent in each executor stage (stats)."""
    return {k: (after.get(f"{k}_us", 0) - before.get(f"{k}_us", 0)) / batches for k in STAGES}


def _streamed(executor: Executor, job, n: int, rounds: int) -> float:
    """Calls/s for `rounds` batches of n through Executor.step, back to back."""
    started = time.perf_counter()
    flight = None
    for _ in range(rounds):
        flight = executor.step(flight, [job() for _ in range(n)])
    while flight is not None:
        flight = executor.step(flight, [])
    return n * rounds / (time.perf_counter() - started)


STAGE_METHODS = (("prepare", "_prepare_all", False), ("encode", "encode", True), ("submit", "submit", True),
                 ("wait", "wait", True), ("read", "read", True), ("answer", "answer_all", True))


def _timed(owner: object, method: str, label: str, spent: dict[str, float], clock=time.perf_counter) -> None:
    """Wrap owner.method (on the instance) to add its seconds (by `clock`) to spent[label]."""
    inner = getattr(owner, method)

    def timed(*args, **kwargs):
        started = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += clock() - started

    setattr(owner, method, timed)


def stage_profile(n: int, rounds: int) -> int:
    """Per-call microseconds of each executor stage, n calls a batch, streamed."""
    executor = Executor(dataclasses.replace(Config.from_env(), max_batch=max(n, 1)), Stats())
    executor.open()
    source = default_stores(None)[0].lookup("double")
    spent = dict.fromkeys([label for label, _, _ in STAGE_METHODS] + ["cost"], 0.0)
    for label, method, on_stages in STAGE_METHODS:
        _timed(executor.stages if on_stages else executor, method, label, spent)
    results: dict[int, bytes] = {}

    def job(k: int, data: bytes) -> Job:
        return Job(KernelCall("double", data, len(data)), source,
                   reply=lambda view: results.__setitem__(k, bytes(view)), fail=lambda error: results.__setitem__(k, error))

    for round_no in range(4):  # the first warms up
        inputs = np.random.default_rng().integers(0, 1 << 30, size=(rounds, n, 4), dtype=np.uint32)
        batches = [[job(r * n + i, inputs[r, i].tobytes()) for i in range(n)] for r in range(rounds)]
        results.clear()
        for label in spent:
            spent[label] = 0.0
        started = time.perf_counter()
        flight = None
        for batch in batches + [[]] * 2:
            landed, flight = flight, executor.step(flight, batch)
            if landed is not None:  # what GpuLoop._learn asks of every landed batch
                asked = time.perf_counter()
                landed.cost()
                spent["cost"] += time.perf_counter() - asked
        total = time.perf_counter() - started
        expected = (inputs * 2).reshape(rounds * n, 4)
        for k in range(rounds * n):
            got = results.get(k)
            assert isinstance(got, bytes) and np.array_equal(np.frombuffer(got, np.uint32), expected[k]), f"call {k}: {got!r}"
        if round_no:
            calls = rounds * n
            parts = "  ".join(f"{label} {secs / calls * 1e6:.2f}" for label, secs in spent.items())
            other = (total - sum(spent.values())) / calls * 1e6
            print(f"batch {n}: {total / calls * 1e6:6.2f} us/call | {parts} | other {other:.2f}", flush=True)
    return 0


def drain_profile(n: int, rounds: int = 2000) -> int:
    """Microseconds a job for the GPU thread to take n queued jobs as a batch."""
    from kem_port.port.gpu_loop import GpuLoop

    config = Config.from_env()
    loop = GpuLoop(Executor(config, Stats()), queue_limit=n + 1, max_batch=n, gathered=None)
    loop.sizer.cap = n  # as learned at n calls a batch
    source = default_stores(None)[0].lookup("double")
    deadline = time.monotonic() + 3600  # the node sends one with every call
    jobs = [Job(KernelCall("double", bytes(4), 4), source, reply=print, fail=print, deadline=deadline) for _ in range(n)]
    for round_no in range(4):
        spent = 0.0
        for _ in range(rounds):
            loop.put_many(jobs[1:])
            started = time.perf_counter()
            batch, control = loop._drain(jobs[0])
            batch = loop._unexpired(batch)
            spent += time.perf_counter() - started
            assert len(batch) == n and control is None and loop.queue.empty()
        if round_no:
            print(f"drain {n}: {spent / rounds / n * 1e6:.3f} us a job", flush=True)
    return 0


def port_profile(n: int, rounds: int) -> int:
    """The GPU thread's CPU a call through a real Router, n calls a frame."""
    import os

    from kem_port.wire import batch_frames, terms
    from kem_port.admission.guard import guard_from_config
    from kem_port.wire.framing import FrameWriter
    from kem_port.kernel_store import KernelResolver
    from kem_port.port.replies import Replies
from kem_port.port.router import Router

    sys.setswitchinterval(0.0002)  # as the port sets it (server.py)
    config, stats = Config.from_env(), Stats()
    executor = Executor(config, stats)
    sink = os.open(os.devnull, os.O_WRONLY)
    router = Router(config, stats, executor, KernelResolver(default_stores(config.kernel_dir), None), Replies(FrameWriter(sink), stats),
                    lambda: False, guard_from_config(config, stats))
    cpu: dict[str, float] = {}
    for label, owner, method in (("drain", router.loop, "_drain"), ("step", executor, "step"),
                                 ("prepare", executor, "_prepare_all"), ("encode", executor.stages, "encode"),
                                 ("submit", executor.stages, "submit"), ("wait", executor.stages, "wait"),
                                 ("read", executor.stages, "read"), ("answer+callbacks", executor.stages, "answer_all"),
                                 ("learn", router.loop, "_learn")):
        cpu[label] = 0.0
        _timed(owner, method, label, cpu, clock=time.thread_time)
    router.start()
    ids = iter(range(1, 1 << 62))

    def request(data: bytes) -> bytes:
        args = tuple(terms.to_term(a) for a in (b"double", data, 1))
        return terms.encode((terms.atom("call"), next(ids), terms.atom("execute_kernel"), args, 60000))

    router.handle_frame(request(bytes(4)))  # compiled off the reader, then run on the GPU thread
    while stats.count("batches") == 0:
        time.sleep(0.01)
    gpu_clock = time.pthread_getcpuclockid(router.loop._thread.ident)
    for round_no in range(4):  # the first warms up
        frames = [batch_frames.encode_calls([request(os.urandom(4)) for _ in range(n)]) for _ in range(rounds)]
        answered, batches = stats.count("batched_calls"), stats.count("batches")
        for label in cpu:
            cpu[label] = 0.0
        started, gpu_started = time.perf_counter(), time.clock_gettime(gpu_clock)
        for frame in frames:
            answered += n
            router.handle_frame(frame)
            while stats.count("batched_calls") < answered:
                time.sleep(0)
        wall, gpu = time.perf_counter() - started, time.clock_gettime(gpu_clock) - gpu_started
        if round_no:
            calls = rounds * n
            parts = "  ".join(f"{label} {secs / calls * 1e6:.2f}" for label, secs in cpu.items())
            print(f"port {n}: {calls / wall:7.0f} calls/s, {calls / (stats.count('batches') - batches):.1f} a batch,"
                  f" GPU thread CPU {gpu / calls * 1e6:.2f} us/call | {parts}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if "--port" in argv:
        rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 200
        return port_profile(int(argv[argv.index("--port") + 1]), rounds)
    if "--drain" in argv:
        return drain_profile(int(argv[argv.index("--drain") + 1]))
    if "--stages" in argv:
        rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 400
        return stage_profile(int(argv[argv.index("--stages") + 1]), rounds)
    stats = Stats()
    # KEM_* settings apply (e.g. KEM_POLL_SPIN_US, KEM_GPU_TIMING).
    executor = Executor(dataclasses.replace(Config.from_env(), max_batch=max(SIZES)), stats)
    executor.open()
    source = default_stores(None)[0].lookup("double")
    done: list = []

    def job() -> Job:
        return Job(KernelCall("double", b"\x01\x03\x05\x07", 4), source, reply=lambda v: done.append(1), fail=done.append)

    executor.run([job()])
    curve = {}
    for n in SIZES:
        rounds = max(5, 2000 // n)
        times = []
        before = stats.snapshot()
        for _ in range(rounds):
            batch = [job() for _ in range(n)]
            t = time.perf_counter()
            executor.run(batch)
            times.append(time.perf_counter() - t)
        per_call = statistics.median(times) / n
        stages = _stage_us(before, stats.snapshot(), rounds)
        # The overlap is compared on totals (outliers included) both ways.
        serial = n * rounds / sum(times)
        streamed = _streamed(executor, job, n, rounds)
        curve[n] = {"calls_per_s": 1 / per_call, "us_per_call": per_call * 1e6,
                    "serial_mean_calls_per_s": serial, "overlapped_calls_per_s": streamed,
                    "us_per_batch": stages}
        print(f"batch {n:3d}: {1 / per_call:9.0f} calls/s  {per_call * 1e6:7.1f} us/call"
              f"  | mean {serial:7.0f} calls/s, overlapped {streamed:7.0f} ({streamed / serial:.2f}x)")
        print("           us a batch: " + "  ".join(f"{k} {v:.0f}" for k, v in stages.items()))
    assert all(d == 1 for d in done), "a call failed"
    result = {"adapter": executor.info["name"], "poll_spin_us": executor.spin_s * 1e6, "curve": curve}
    if len(argv) > 1:
        with open(argv[1], "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
