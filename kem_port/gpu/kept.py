"""Caches of what a kernel's text gives (its reflected shape, the names an
entry point reaches), bounded and safe to fill from several threads."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")
_MISSING = object()  # None is a value kept too (used_names' "cannot tell")

# Kernel shapes kept per text: a few KB each, so 1,024 texts are a few MB
# however many distinct kernels strangers send (each one admitted first).
SHAPES = 1024


def kept(cache: OrderedDict, key: Hashable, make: Callable[[], T], limit: int) -> T:
    """cache[key], made and kept when missing, the oldest dropped past
    `limit`. The reader, fetch threads and the GPU thread fill these at
    once: each step here is one step under the GIL (popitem, not
    pop(next(iter(...))), which let two threads evict one key and failed a
    call as internal), and the value made is returned, not read back."""
    found = cache.get(key, _MISSING)
    if found is _MISSING:
        found = cache[key] = make()
        while len(cache) > limit:
            try:
                cache.popitem(last=False)
            except KeyError:  # another thread emptied it first
                break
    return found
