#!/usr/bin/env python3
"""Per-call CPU of the port's two threads for N-call group frames against
N-call calls frames (docs/protocol.md, "Group frames"), in one process.

A real Router here (real wgpu, kem's executor and GPU thread; replies
written by a FrameWriter to a pipe that a collector thread reads and checks
against numpy, every call) is fed frames of N ``execute_kernel`` calls of
the packaged ``double`` kernel on fresh random inputs, as kem_port.erl
sends them: a calls frame of N request binaries, or one group frame. After
each frame the script waits until all N calls are answered, so each frame
is one GPU batch. ``--kernel double_table`` sends the same calls to the
call-table kernel (docs/dispatch.md): a group of it is ONE dispatch
(gpu/group_table.py), a calls frame's calls share one table. The two kinds
alternate round by round (same run, same machine state), and each round
prints, as JSON lines:

* ``reader_us``: the reader thread's CPU (``time.thread_time``) inside
  ``Router.handle_frame``, per call, median over the round's frames;
* ``gpu_thread_us``: the GPU thread's CPU (its thread clock) over the
  round, per call;
* ``gpu_stages_us``: that CPU split by the GPU thread's stages (each
  method timed by the thread clock once a batch, so the timer costs
  nothing per call; ``answer`` includes the reply callbacks);
* ``calls_per_s``: N calls a frame, one frame at a time (wall clock; the
  collector's checking is in it, for both kinds alike);
* ``calls_per_dispatch``: calls over dispatches in the round (the port's
  ``table_calls`` / ``table_dispatches`` for double_table; 1 for double).

Usage: scripts/bench_group.py [--kernel double|double_table] [--calls 64] [--frames 200] [--rounds 3] [--size 16]
(KEM_* settings apply, e.g. KEM_POLL_SPIN_US=0 as in docs/benchmarks.md.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_curve import _timed  # noqa: E402
from bench_reader import CALL, EXECUTE, Collector, build_router  # noqa: E402
from kem_port.wire import batch_frames  # noqa: E402
from kem_port.wire.group_frames import encode_group  # noqa: E402

import erlang  # noqa: E402

KERNELS = ("double", "double_table")  # the same values: each input word doubled


def calls_frame(kernel: bytes, first_id: int, inputs: list[bytes]) -> bytes:
    name = erlang.OtpErlangBinary(kernel)
    return batch_frames.encode_calls([
        erlang.term_to_binary((CALL, first_id + n, EXECUTE, (name, erlang.OtpErlangBinary(data), 1), 60000))
        for n, data in enumerate(inputs)])


def group_frame(kernel: bytes, first_id: int, inputs: list[bytes]) -> bytes:
    return encode_group(kernel, 1, [(first_id + n, 60000) for n in range(len(inputs))], inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=KERNELS, default="double", help="the packaged kernel called")
    parser.add_argument("--calls", type=int, default=64, help="calls a frame (2-256)")
    parser.add_argument("--frames", type=int, default=200, help="frames a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind, alternating")
    parser.add_argument("--size", type=int, default=16, help="input bytes a call (a multiple of 4)")
    args = parser.parse_args()
    sys.setswitchinterval(0.0002)  # as the port sets it (server.py)
    collector = Collector()
    router, stats = build_router(collector.write_fd)
    gpu_clock = time.pthread_getcpuclockid(router.loop._thread.ident)
    executor = router.executor
    stages: dict[str, float] = {}
    for label, owner, method in (("drain", router.loop, "_drain"), ("prepare", executor, "_prepare_all"),
                                 ("encode", executor.stages, "encode"), ("submit", executor.stages, "submit"),
                                 ("wait", executor.stages, "wait"), ("read", executor.stages, "read"),
                                 ("answer", executor.stages, "answer_all"), ("learn", router.loop, "_learn")):
        stages[label] = 0.0
        _timed(owner, method, label, stages, clock=time.thread_time)
    rng = np.random.default_rng()
    next_id, answered = 1, 0
    builders = {"calls": calls_frame, "group": group_frame}
    kernel = args.kernel.encode()

    def one_frame(kind: str) -> float:
        nonlocal next_id, answered
        n = args.calls
        inputs = collector.expect_doubles(next_id, n, args.size, rng)
        frame = builders[kind](kernel, next_id, inputs)
        next_id += n
        started = time.thread_time()
        router.handle_frame(frame)
        cpu = time.thread_time() - started
        answered += n
        collector.wait_for(answered)
        return cpu / n

    for kind in ("calls", "group"):  # compile, warm the pools, the caches and the batch sizer
        for _ in range(30):
            one_frame(kind)
    for round_no in range(args.rounds):
        for kind in ("calls", "group") if round_no % 2 == 0 else ("group", "calls"):
            stages.update(dict.fromkeys(stages, 0.0))
            dispatched = stats.count("table_dispatches")
            gpu_started, started = time.clock_gettime(gpu_clock), time.perf_counter()
            reader = [one_frame(kind) for _ in range(args.frames)]
            wall, gpu = time.perf_counter() - started, time.clock_gettime(gpu_clock) - gpu_started
            calls = args.frames * args.calls
            dispatches = stats.count("table_dispatches") - dispatched if args.kernel == "double_table" else calls
            print(json.dumps({
                "kernel": args.kernel, "kind": kind, "round": round_no, "calls_a_frame": args.calls, "size": args.size,
                "reader_us": round(statistics.median(reader) * 1e6, 2), "gpu_thread_us": round(gpu / calls * 1e6, 2),
                "gpu_stages_us": {label: round(secs / calls * 1e6, 2) for label, secs in stages.items()},
                "calls_per_s": round(calls / wall), "calls_per_dispatch": round(calls / max(dispatches, 1), 1),
            }), flush=True)
    if collector.wrong or collector.errors:
        raise SystemExit(f"{len(collector.wrong)} wrong results, {collector.errors} error replies")
    print(json.dumps({"checked_calls": answered, "group_frames": stats.count("group_frames"),
                      "calls_frames": stats.count("calls_frames"), "group_jobs": stats.count("group_jobs"),
                      "table_group_jobs": stats.count("table_group_jobs"), "slot_dispatches": stats.count("slot_dispatches")}), flush=True)


if __name__ == "__main__":
    main()
