"""Where is call ReqId? Asked by the node when a call's timer fires.

A call past its timeout may be fetching its kernel, waiting in the GPU
queue, or running on the GPU. Only the last is a stuck GPU worth killing
the port for (kem_port.erl); the others are answered ``timeout`` with what
they were waiting for, and the port, its compiled kernels and everyone
else's calls stay. The ``call_state`` method answers ``#{state, detail}``
with ``state`` one of ``running``, ``queued``, ``fetching``, ``admitting``
(its new kernel compiling in the guard, admission/guard.py) or ``unknown``
(already answered, or never seen).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kem_port.port.gpu_loop import GpuLoop


class CallStates:
    def __init__(self, loop: GpuLoop) -> None:
        self.loop = loop
        self._waiting: dict[Any, tuple[str, str, float]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def waiting(self, req_id: Any, state: str, for_what: str) -> Iterator[None]:
        """Mark req_id as in ``state`` (``fetching``, ``admitting``), waiting
        ``for_what``, while the block runs."""
        with self._lock:
            self._waiting[req_id] = (state, for_what, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                self._waiting.pop(req_id, None)

    def describe(self, req_id: Any) -> dict[str, str]:
        with self._lock:
            found = self._waiting.get(req_id)
        if found is not None:
            state, for_what, since = found
            waited = (time.monotonic() - since) * 1000
            return {"state": state, "detail": f"waiting {waited:.0f} ms for {for_what}"}
        where = self.loop.state_of(req_id)
        if where is None:
            return {"state": "unknown", "detail": "the port holds no such call (already answered, or never received)"}
        state, ahead = where
        if state == "running":
            return {"state": "running", "detail": "the GPU thread is inside this call"}
        return {"state": "queued", "detail": f"queued behind {ahead} calls; the GPU was busy with other work"}
