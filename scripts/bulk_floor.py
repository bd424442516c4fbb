#!/usr/bin/env python3
"""The port's side of the host floors for bulk payloads (no GPU): copies
between a tmpfs file and memory, fresh or kept, on one thread or several,
with numpy's memcpy as the yardstick (docs/benchmarks.md, "Bulk copies,
round three"). Run by scripts/bench_bulk_floor after the Erlang side.

Usage: scripts/bulk_floor.py [MB] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kem_port.transfer.bulk_io import split  # noqa: E402
from kem_port.transfer.fd_io import read_into, write_all  # noqa: E402

REPS = 9


def median_s(fn: Callable[[], None]) -> float:
    fn()
    times = []
    for _ in range(REPS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def rows(path: str, size: int, pool: ThreadPoolExecutor) -> list[tuple[str, Callable[[], None]]]:
    kept = np.ones(size, np.uint8)
    other = np.zeros_like(kept)
    view = memoryview(kept)

    def read(into: memoryview, threads: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if threads == 1:
                read_into(fd, into)
            else:
                list(pool.map(lambda r: os.preadv(fd, [into[r[0]:r[1]]], r[0]), split(size, threads)))
        finally:
            os.close(fd)

    def write(name: str, fresh: bool, threads: int, one_file: bool) -> None:
        def part(k: int, a: int, b: int) -> None:
            target = f"{path}.{name}" if one_file else f"{path}.{name}{k}"
            if fresh:
                try:
                    os.unlink(target)
                except FileNotFoundError:
                    pass
            fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                if one_file:
                    os.pwritev(fd, [view[a:b]], a)
                else:
                    write_all(fd, [view[a:b]])
            finally:
                os.close(fd)
        ranges = split(size, threads)
        if threads == 1:
            part(0, 0, size)
        else:
            list(pool.map(lambda kr: part(kr[0], *kr[1]), enumerate(ranges)))

    def copy(threads: int) -> None:
        list(pool.map(lambda r: np.copyto(other[r[0]:r[1]], kept[r[0]:r[1]]), split(size, threads)))

    return [
        ("read file -> fresh bytearray", lambda: read(memoryview(bytearray(size)), 1)),
        ("read file -> fresh np.empty, 8 threads", lambda: read(memoryview(np.empty(size, np.uint8)), 8)),
        ("read file -> kept buffer", lambda: read(view, 1)),
        ("read file -> kept buffer, 8 threads", lambda: read(view, 8)),
        ("write fresh file", lambda: write("fresh", True, 1, True)),
        ("write kept file", lambda: write("kept", False, 1, True)),
        ("write one kept file, 4 threads", lambda: write("kept", False, 4, True)),
        ("write 8 fresh part files, 8 threads", lambda: write("fpart", True, 8, False)),
        ("write 8 kept part files, 8 threads", lambda: write("part", False, 8, False)),
        ("numpy memcpy", lambda: np.copyto(other, kept)),
        ("numpy memcpy, 8 threads", lambda: copy(8)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mb", nargs="?", type=int, default=64)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    size = args.mb << 20
    scratch = tempfile.mkdtemp(dir=args.dir, prefix="kem-floor-")
    try:
        path = os.path.join(scratch, "payload")
        Path(path).write_bytes(os.urandom(size))
        with ThreadPoolExecutor(8) as pool:
            for name, fn in rows(path, size, pool):
                s = median_s(fn)
                print(json.dumps({"side": "port", "size_mb": args.mb, "way": name,
                                  "median_ms": round(s * 1e3, 2), "gb_per_s": round(size / s / 1e9, 2)}), flush=True)
    finally:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
