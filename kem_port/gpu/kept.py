"""Caches of what a kernel's text gives (its reflected shape, the names an
entry point reaches), bounded by count and by the texts' bytes, and safe to
fill from several threads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
_MISSING = object()  # None is a value kept too (used_names' "cannot tell")

# Kernel shapes kept per text. A shape grows with its text, about 16 times
# its bytes: a 540 KB kernel of 20,000 overrides (admission takes it, under
# its 200k syntax nodes) reflects to 8.6 MB (tracemalloc, red team 5), so a
# count alone let 1,024 such shapes reach ~9 GB. Bounded by both: 1,024
# texts, and 16 MiB of text (~260 MB of shapes) a cache; a typical kernel's
# 1-10 KB keeps the count the bound that bites. Not lower: an evicted shape
# is reflected again when its cached pipeline's params are checked, 0.5 s
# for that 529 KB text on the dev machine, so ~30 such kernels fit before
# their calls start paying it.
SHAPES = 1024
SHAPE_TEXT_BYTES = 16 << 20


class Kept(Generic[T]):
    """Values by key, made once when missing, the oldest dropped past
    `limit` entries or past `budget` in summed costs (each value's cost is
    the caller's measure, a text's bytes; 0 by default)."""

    def __init__(self, limit: int, budget: int | None = None) -> None:
        self.limit, self.budget = limit, budget
        self._items: OrderedDict[Hashable, tuple[T, int]] = OrderedDict()
        self._cost = 0
        # Only a fill takes the lock (a miss: a reflection, ms); a hit is one
        # dict get. Before this, two threads trimming with pop(next(iter(...)))
        # evicted one key and a call was answered internal.
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T], cost: int = 0) -> T:
        found = self._items.get(key, _MISSING)
        if found is not _MISSING:
            return found[0]
        value = make()  # outside the lock: two threads may both make one; either value is right
        with self._lock:
            if key not in self._items:
                self._items[key] = (value, cost)
                self._cost += cost
            while len(self._items) > self.limit or (self.budget is not None and self._cost > self.budget and len(self._items) > 1):
                _, (_, dropped) = self._items.popitem(last=False)
                self._cost -= dropped
        return value

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    @property
    def cost(self) -> int:
        return self._cost
