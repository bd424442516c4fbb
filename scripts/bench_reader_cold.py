#!/usr/bin/env python3
"""The reader's Python around a lone call, warm and with cold caches.

On a GPU machine the reader's parse, intake and reply cost ~50 us of a
lone call (scripts/bench_lone.py --router), for work that takes ~15 us when
run back to back: the driver's submit and wait in between evict the
caches, and every Python function and object the reader touches afterwards
is fetched again. This script shows that split without the GPU's noise: a
real Router (as bench_lone.py's Router row builds it), whose lone road
answers each call at once with its doubled input, computed with numpy,
instead of running it on the adapter (the GPU road is bench_lone.py's
subject, not this one's); ``--cold MB`` streams that many MB through the
caches inside the road, as the driver's work does. Rows interleave this
checkout and ``--against REV``; each prints the reader's stage p50s in us.

Usage: scripts/bench_reader_cold.py [--iterations N] [--cold MB] [--against REV]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lone import AgainstLone, KemLone, RouterLone  # noqa: E402


class AnsweredAtOnce:
    """A lone road that answers with the doubled input (after streaming
    `cold_bytes` through the caches, when asked): `run` as LoneRoad.run
    (today's road), `run_known` and `count_known` as the folded road's."""

    def __init__(self, cold_bytes: int, stats) -> None:
        self.streamed = np.ones(cold_bytes, np.uint8) if cold_bytes else None
        self.stats = stats

    def run(self, job) -> bool:
        job.answer(memoryview(self.run_known(None, job.call.input)))
        return True

    def run_known(self, key, data: bytes) -> bytes:
        if self.streamed is not None:
            self.streamed.sum()
        return (np.frombuffer(data, np.uint32) * np.uint32(2)).tobytes()

    def count_known(self, extra) -> None:
        self.stats.bump(extra)

    def install(self, executor) -> None:
        """Replace the executor's lone road before a RouterLone times it."""
        executor.lone.run, executor.lone.run_known, executor.lone.count_known = self.run, self.run_known, self.count_known


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--cold", type=int, default=0, help="MB streamed through the caches inside each call (0: warm)")
    parser.add_argument("--against", default="", help="a git revision whose port runs interleaved")
    args = parser.parse_args()
    kem = KemLone(None)
    AnsweredAtOnce(args.cold << 20, kem.stats).install(kem.executor)
    rows = {"this checkout": RouterLone(kem.executor, kem.stats)}
    if args.against:
        against = AgainstLone(args.against, None)
        AnsweredAtOnce(args.cold << 20, against.stats).install(against.executor)
        rows[f"at {args.against}"] = RouterLone(against.executor, against.stats, "kem_against")
    rng = np.random.default_rng()
    warmup = max(args.iterations // 10, 50)
    for n in range(warmup + args.iterations):
        if n == warmup:
            for row in rows.values():
                for values in row.stages.values():
                    values.clear()
        data = rng.integers(0, 2**32, 1, dtype=np.uint32).tobytes()
        for row in rows.values():
            row.call(data)
    for name, row in rows.items():
        stages = {s: round(statistics.median(v) * 1e6, 1) for s, v in row.stages.items() if s != "gpu_road"}
        print(json.dumps({"path": name, "cold_mb": args.cold, **stages,
                          "reader_sum_p50_us": round(sum(stages.values()), 1)}), flush=True)


if __name__ == "__main__":
    main()
