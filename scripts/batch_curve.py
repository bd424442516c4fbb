#!/usr/bin/env python3
"""Calls/s of the executor alone against batch size (small double calls),
in-process, so the port and pipes are out of the picture: the curve that
sets KEM_MAX_BATCH's default. Usage: python scripts/batch_curve.py [out.json]"""

from __future__ import annotations

import json
import statistics
import sys
import time

from kem_port.config import Config
from kem_port.executor import Executor, Job
from kem_port.kernel_store import default_stores
from kem_port.protocol import KernelCall
from kem_port.stats import Stats

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def main(argv: list[str]) -> int:
    executor = Executor(Config(max_batch=max(SIZES)), Stats())
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
        for _ in range(rounds):
            batch = [job() for _ in range(n)]
            t = time.perf_counter()
            executor.run(batch)
            times.append(time.perf_counter() - t)
        per_call = statistics.median(times) / n
        curve[n] = {"calls_per_s": 1 / per_call, "us_per_call": per_call * 1e6}
        print(f"batch {n:3d}: {1 / per_call:9.0f} calls/s  {per_call * 1e6:7.1f} us/call")
    assert all(d == 1 for d in done), "a call failed"
    result = {"adapter": executor.info["name"], "curve": curve}
    if len(argv) > 1:
        with open(argv[1], "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
