"""Counters and timings a node operator reads through ``stats``."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._rejections: Counter[str] = Counter()
        self._seconds: defaultdict[str, float] = defaultdict(float)
        self._batch_sizes: Counter[int] = Counter()
        self._started = time.monotonic()

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def count_on_reader(self, name: str) -> None:
        """One more of a counter that only the reader thread ever changes
        (``calls``, ``inline_calls``), without the lock: the GIL runs
        ``Counter.__missing__`` and the dict's store whole, and no other
        thread writes these names, so no increment is lost; readers
        (count, snapshot) take the lock and copy the dict in one C call.
        A lone call took the lock twice after its reply (~0.35 us each,
        more with the caches cold after the GPU wait)."""
        self._counts[name] += 1

    def error(self, reason: str) -> None:
        with self._lock:
            self._errors[reason] += 1

    def rejection(self, reason: str) -> None:
        with self._lock:
            self._rejections[reason] += 1

    def add_time(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] += seconds

    def batch(self, size: int) -> None:
        with self._lock:
            self._batch_sizes[size] += 1
            self._counts["batches"] += 1
            self._counts["batched_calls"] += size

    def bump(self, counts: Iterable[tuple[str, int]], seconds: Iterable[tuple[str, float]] = (), batch_size: int = 0) -> None:
        """Several counters and timers (and a batch of batch_size) under one
        acquisition of the lock: a lone call's dozen updates one at a time
        took the lock a dozen times (~0.35 us each)."""
        with self._lock:
            counts_, times = self._counts, self._seconds
            for name, n in counts:
                counts_[name] += n
            for name, secs in seconds:
                times[name] += secs
            if batch_size:
                self._batch_sizes[batch_size] += 1
                counts_["batches"] += 1
                counts_["batched_calls"] += batch_size

    def count(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        with self._lock:
            snap: dict[str, Any] = dict(self._counts)
            snap["errors"] = dict(self._errors)
            snap["rejections"] = dict(self._rejections)
            for name, secs in self._seconds.items():
                snap[f"{name}_us"] = int(secs * 1e6)
            snap["batch_sizes"] = {int(k): v for k, v in sorted(self._batch_sizes.items())}
            snap["uptime_ms"] = int((time.monotonic() - self._started) * 1000)
        if extra:
            snap.update(extra)
        return snap
