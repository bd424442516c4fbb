"""The compile guard's admissions (admission/guard.py): what the port may
compile, by admission key.

A key without a constants set (kernel sha256, entry point, shape) is kept
for the port's life in a plain dict, which the reader's lone road reads
itself (port/lone_call.py: one lookup). A key with a constants set is kept
in an LRU of MAX_ADMITTED_SETS: the set is the caller's choice, and without
a bound a stranger's endless distinct sets (SCALE = 1.0, 1.5, 2.0, ...)
grew the port by a record each, never dropped.
"""

from __future__ import annotations

from collections import OrderedDict

from kem_port.kernel_store import KernelSource

# 4x the port's pipelines kept per kernel (64, gpu/pipelines.py) and far
# over the handful of sets a real host template is called with. A set
# pushed out costs its next call one worker compile (~10-50 ms on
# lavapipe), never a wrong answer; a refused set stays refused (the
# guard's own failure cache, or the same check again).
MAX_ADMITTED_SETS = 256


class Admitted:
    def __init__(self) -> None:
        self.plain: dict[tuple, KernelSource] = {}
        self.sets: OrderedDict[tuple, KernelSource] = OrderedDict()

    def get(self, key: tuple) -> KernelSource | None:
        """The admitted source for key, or None; a set's entry is marked
        recently used."""
        if len(key) <= 3:
            return self.plain.get(key)
        found = self.sets.get(key)
        if found is not None:
            try:
                self.sets.move_to_end(key)
            except KeyError:  # pushed out meanwhile by another thread's admission
                pass
        return found

    def put(self, key: tuple, source: KernelSource) -> None:
        if len(key) <= 3:
            self.plain[key] = source
            return
        self.sets[key] = source
        self.sets.move_to_end(key)
        while len(self.sets) > MAX_ADMITTED_SETS:
            self.sets.popitem(last=False)
