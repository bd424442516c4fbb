"""How many queued calls go into one GPU batch, learned from what batches cost.

A batch takes what is queued (so it is 1 when the port is idle), up to a
cap. The cap is not a constant because the cost curve is not one shape:
on lavapipe per-call cost falls until ~16 and stays flat; on an NVIDIA
H200 it falls until 16 and then jumps ~6x at 32 (a fixed ~11 ms a batch)
before falling again (docs/benchmarks.md, scripts/batch_curve.py). The
sizer keeps a moving average of microseconds per call for each
power-of-two batch size, from batches of small calls only (large payloads
measure copies, not batching), and moves the cap when batches arrive full:
up while doubling has paid or is untried, down when half was cheaper.
Costs above the cap are forgotten now and then, so a change of load or
device is noticed.
"""

from __future__ import annotations

ALPHA = 0.3
EXPLORE_EVERY = 2000  # full batches between forgetting costs above the cap


class BatchSizer:
    def __init__(self, max_batch: int, start: int = 8) -> None:
        self.max = max(1, max_batch)
        self.cap = min(start, self.max)
        self.cost: dict[int, float] = {}  # bucket -> EWMA us per call
        self._full_batches = 0

    def limit(self) -> int:
        return self.cap

    def record(self, calls: int, seconds: float, small: bool) -> None:
        if not small or calls <= 0:
            return
        bucket = 1 << (calls.bit_length() - 1)
        per_call = seconds * 1e6 / calls
        old = self.cost.get(bucket)
        self.cost[bucket] = per_call if old is None else old + ALPHA * (per_call - old)
        if calls >= self.cap:
            self._adjust()

    def _adjust(self) -> None:
        self._full_batches += 1
        if self._full_batches % EXPLORE_EVERY == 0:
            self.cost = {b: c for b, c in self.cost.items() if b <= self.cap}
        here = self.cost.get(self.cap)
        if here is None:
            return
        half = self.cost.get(self.cap // 2) if self.cap > 1 else None
        if half is not None and half < here * 0.95:
            self.cap //= 2
            return
        double = self.cost.get(self.cap * 2)
        if self.cap * 2 <= self.max and (double is None or double < here * 0.95):
            self.cap *= 2
