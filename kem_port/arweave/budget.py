"""How long a kernel fetch may take: bounded below its call's deadline.

A gateway that never answers used to cost ``KEM_FETCH_TIMEOUT_MS`` x (1 +
``KEM_FETCH_RETRIES``) per gateway (30.3 s with the defaults), at least the
30 s call timeout: the caller heard a bare ``timeout`` and its port was
killed. Now the router gives each fetch the call's deadline less a reserve
for the reply (:func:`fetch_deadline`); the fetching thread holds it in
:func:`within`, and the store (store.py) cuts the fetch's own deadline
(``KEM_FETCH_DEADLINE_MS``) to it: every gateway request takes ``min(
per-request timeout, time left)`` and is not retried past it, so the caller
hears ``timeout`` naming the fetch before its own timer fires, and the port
stays.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


def fetch_deadline(deadline: float | None, timeout_s: float | None) -> float | None:
    """The call's deadline less 10% of its timeout (0.1 s to 1 s): time to
    send the answer before the node's own timer fires."""
    if deadline is None or timeout_s is None:
        return None
    return deadline - min(1.0, max(0.1, 0.1 * timeout_s))


@contextmanager
def within(deadline: float | None) -> Iterator[None]:
    """Fetches on this thread end by ``deadline`` (``time.monotonic()``)."""
    previous = getattr(_local, "deadline", None)
    _local.deadline = deadline
    try:
        yield
    finally:
        _local.deadline = previous


def left() -> float | None:
    """Seconds this thread's fetch has left; None when it has no deadline."""
    deadline = getattr(_local, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()
