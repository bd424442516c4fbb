#!/usr/bin/env python3
"""The reader thread's Python per call, for calls that arrive in calls frames.

A real Router in this process (real wgpu, kem's executor and GPU thread,
replies written by a FrameWriter to /dev/null) is fed ``{calls, [...]}``
frames as kem_port.erl sends them: each call an ``execute_kernel`` of the
packaged ``double`` kernel on a fresh random input, built with erlang-py.
After each frame the script waits until every call in it was answered, so
the queue never fills and every call takes the accepted path.

Prints, as JSON lines:

* ``reader_cpu_us_per_call``: the reader thread's CPU time
  (``time.thread_time``) inside ``handle_frame``, per call, median over
  rounds, without a profiler; the figure ``scripts/bench wire`` reports
  per call for the whole port, narrowed to the reader;
* with ``--profile``, cProfile over the reader only (it profiles the thread
  that enables it), as µs per call by function (own time), largest first.

The answers are checked: every call's result must come back (the replies
frames are decoded from a pipe copy with batch_frames.split_replies and
compared with numpy) -- see ``--check``.

Usage: scripts/bench_reader.py [--calls-per-frame 64] [--frames 300] [--size 16] [--profile] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

import erlang
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kem_port.wire import batch_frames, framing  # noqa: E402
from kem_port.admission.guard import guard_from_config  # noqa: E402
from kem_port.config import Config  # noqa: E402
from kem_port.gpu.executor import Executor  # noqa: E402
from kem_port.kernel_store import KernelResolver, default_stores  # noqa: E402
from kem_port.port.replies import Replies
from kem_port.port.router import Router  # noqa: E402
from kem_port.stats import Stats  # noqa: E402

CALL, EXECUTE = erlang.OtpErlangAtom("call"), erlang.OtpErlangAtom("execute_kernel")
KERNEL = erlang.OtpErlangBinary(b"double")


class Collector:
    """Reads the router's output pipe on a thread and checks each result."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.want: dict[int, bytes] = {}
        self.got = 0
        self.wrong: list[int] = []
        self.errors = 0
        self.cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def expect_doubles(self, first_id: int, n: int, size: int, rng: np.random.Generator) -> list[bytes]:
        """n fresh random inputs of size bytes for ReqIds first_id.., each
        expected back doubled (the `double` kernel)."""
        inputs = [rng.integers(0, 2**31, size // 4, dtype=np.uint32).tobytes() for _ in range(n)]
        with self.cond:
            for k, data in enumerate(inputs):
                self.want[first_id + k] = (np.frombuffer(data, dtype=np.uint32) * 2).tobytes()
        return inputs

    def _run(self) -> None:
        while True:
            frame = framing.read_frame(self.read_fd, 1 << 30)
            if frame is None:
                return
            results = batch_frames.split_replies(frame)
            if results is None:
                term = erlang.binary_to_term(frame)
                ok = term[2]
                if ok[0] == erlang.OtpErlangAtom("ok"):
                    results = [(term[1], ok[1].value)]
                else:
                    with self.cond:
                        self.errors += 1
                        self.got += 1
                        self.cond.notify_all()
                    continue
            with self.cond:
                for req_id, payload in results:
                    if self.want.pop(req_id, None) != payload:
                        self.wrong.append(req_id)
                    self.got += 1
                self.cond.notify_all()

    def wait_for(self, total: int) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.got >= total, timeout=60):
                raise SystemExit(f"only {self.got} of {total} answers came back")


def build_router(writer_fd: int) -> tuple[Router, Stats]:
    stats = Stats()
    config = Config.from_env()  # KEM_* settings apply (KEM_POLL_SPIN_US, KEM_SLOT_DISPATCH...)
    executor = Executor(config, stats)
    executor.open()
    resolver = KernelResolver(default_stores(config.kernel_dir), None)
    router = Router(config, stats, executor, resolver, Replies(framing.FrameWriter(writer_fd), stats), lambda: False,
                    guard_from_config(config, stats))
    router.start()
    return router, stats


def calls_frame(first_id: int, inputs: list[bytes]) -> bytes:
    frames = [erlang.term_to_binary((CALL, first_id + n, EXECUTE, (KERNEL, erlang.OtpErlangBinary(data), 1), 60000))
              for n, data in enumerate(inputs)]
    return batch_frames.encode_calls(frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls-per-frame", type=int, default=64)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--size", type=int, default=16, help="input bytes per call (a multiple of 4)")
    parser.add_argument("--profile", action="store_true", help="also run the rounds under cProfile and print µs per call by function")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    collector = Collector()
    router, stats = build_router(collector.write_fd)
    rng = np.random.default_rng()
    next_id = 1
    answered = 0

    def one_frame(profile: cProfile.Profile | None) -> float:
        nonlocal next_id, answered
        n = args.calls_per_frame
        inputs = collector.expect_doubles(next_id, n, args.size, rng)
        frame = calls_frame(next_id, inputs)
        next_id += n
        started = time.thread_time()
        if profile is not None:
            profile.enable()
        router.handle_frame(frame)
        if profile is not None:
            profile.disable()
        cpu = time.thread_time() - started
        answered += n
        collector.wait_for(answered)
        return cpu / n

    for _ in range(20):  # compile, warm the pools and the batch sizer
        one_frame(None)
    per_call = [one_frame(None) for _ in range(args.frames)]
    if collector.wrong or collector.errors:
        raise SystemExit(f"{len(collector.wrong)} wrong results, {collector.errors} error replies")
    print(json.dumps({
        "what": "reader_cpu_us_per_call", "calls_per_frame": args.calls_per_frame, "frames": args.frames,
        "size": args.size, "p50_us": round(statistics.median(per_call) * 1e6, 2),
        "mean_us": round(statistics.fmean(per_call) * 1e6, 2), "calls_frames": stats.count("calls_frames"),
        "inline_calls": stats.count("inline_calls"),
    }), flush=True)
    if not args.profile:
        return
    profile = cProfile.Profile()
    for _ in range(args.frames):
        one_frame(profile)
    calls = args.frames * args.calls_per_frame
    rows = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    ranked = sorted(rows.items(), key=lambda item: item[1][2], reverse=True)[: args.top]
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in ranked:
        print(json.dumps({"function": f"{Path(file).name}:{line}:{name}", "calls_per_call": round(ncalls / calls, 2),
                          "own_us": round(tottime / calls * 1e6, 2), "cum_us": round(cumtime / calls * 1e6, 2)}))
    total = sum(row[2] for row in rows.values())
    print(json.dumps({"what": "profiled_total_us_per_call", "us": round(total / calls * 1e6, 2)}))


if __name__ == "__main__":
    main()
