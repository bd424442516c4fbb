"""How much work one port holds at once: calls and bytes, wherever they wait.

The GPU queue bounded calls only, and calls waiting on a gateway fetch or
on the compile worker were outside it: a few callers could park thousands
of calls (and their inputs) there. Every kernel call now takes a share of
this budget when it is accepted and gives it back when it is answered,
whether it waited on a fetch, the compile worker or the GPU queue; a call
that would exceed either bound hears ``overloaded`` at once.
"""

from __future__ import annotations

import threading

from kem_port.errors import KemError


class WorkBudget:
    def __init__(self, max_calls: int, max_bytes: int) -> None:
        self.max_calls = max_calls
        self.max_bytes = max_bytes
        self.calls = 0
        self.bytes = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        """Hold one call of `size` bytes, or raise overloaded. A lone call
        larger than the byte budget is still let in (the size limits bound
        it), so no request is refused forever."""
        with self._lock:
            if self.calls >= self.max_calls:
                raise KemError("overloaded", f"{self.max_calls} calls are already held by this port")
            if self.calls and self.bytes + size > self.max_bytes:
                raise KemError("overloaded", f"calls holding {self.bytes} bytes are already queued (KEM_QUEUE_BYTES={self.max_bytes})")
            self.calls += 1
            self.bytes += size

    def take_many(self, calls: int, size: int) -> None:
        """Hold `calls` calls of `size` bytes in all at once (a group frame,
        group_frames.py), or raise overloaded and hold none of them; each is
        given back on its own (give) as it is answered."""
        with self._lock:
            if self.calls + calls > self.max_calls:
                raise KemError("overloaded", f"{self.max_calls} calls are already held by this port")
            if self.calls and self.bytes + size > self.max_bytes:
                raise KemError("overloaded", f"calls holding {self.bytes} bytes are already queued (KEM_QUEUE_BYTES={self.max_bytes})")
            self.calls += calls
            self.bytes += size

    def give(self, size: int) -> None:
        with self._lock:
            self.calls -= 1
            self.bytes -= size

    def give_many(self, calls: int, size: int) -> None:
        with self._lock:
            self.calls -= calls
            self.bytes -= size

    def describe(self) -> dict:
        with self._lock:
            return {"held_calls": self.calls, "held_bytes": self.bytes}
