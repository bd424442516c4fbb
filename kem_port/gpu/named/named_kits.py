"""The kits of named-buffer calls (named_kit.py), kept per call shape.

A shape's kit holds its buffers, bind groups and staging: up to KITS
shapes of up to KIT_BYTES each stay (64 MiB at most); a larger shape's kit
is made for its call and released after it. A batch (named_batch.py) that
holds two calls of one shape needs a second kit for the second: a replica,
kept for small shapes only (REPLICAS of up to REPLICA_BYTES: 4 MiB at
most); a call with none to spare runs alone. A batch's copies land in one
staging buffer, kept here: one map for the batch instead of one a call.
"""

from __future__ import annotations

from collections import OrderedDict

import wgpu

from kem_port.gpu.named.binding_model import Bound
from kem_port.gpu.named.named_kit import NamedKit
from kem_port.gpu.named.named_plan import NamedPlan

KITS = 16  # call shapes kept with their buffers
KIT_BYTES = 4 << 20  # a shape's buffers up to this are kept: at most 64 MiB in all
REPLICAS = 64  # extra kits for calls of one shape in one batch
REPLICA_BYTES = 64 << 10  # ... each of a shape this small: at most 4 MiB in all
BATCH_STAGING = 16 << 20  # one staging buffer for a batch's copies, up to this


class NamedKits:
    def __init__(self) -> None:
        self._kits: OrderedDict[tuple, NamedKit] = OrderedDict()
        self._replicas: OrderedDict[tuple, NamedKit] = OrderedDict()
        self._staging: wgpu.GPUBuffer | None = None
        # Shapes a batch being planned has taken (named_run.run_many): not
        # released to make room (a 24-shape batch lost its first kits to its
        # later calls' planning: every call of it a gpu_error), nor dropped
        # by a batch-mate's error on a large shape, run alone meanwhile.
        self.held: set[tuple] = set()

    def clear(self) -> None:
        """Forget every kit (a new device: the old one's buffers go with it)."""
        self._kits.clear()
        self._replicas.clear()
        self._staging = None

    def get(self, device: wgpu.GPUDevice, layouts: dict, bound: list[Bound], shape: tuple, gas_group: int | None) -> NamedKit:
        kit = self._kits.get(shape)
        if kit is not None and kit.live:
            self._kits.move_to_end(shape)
            return kit
        kit = NamedKit(device, layouts, bound, gas_group)
        if kit.bytes <= KIT_BYTES:
            self._kits[shape] = kit
            spare = [s for s in self._kits if s not in self.held and s != shape][: max(len(self._kits) - KITS, 0)]
            for old in spare:  # the least recently used first
                self._kits.pop(old).release()
        return kit

    def hold(self) -> set[tuple]:
        """The held set, emptied: a batch's planning adds the shapes it takes."""
        self.held.clear()
        return self.held

    def replica(self, device: wgpu.GPUDevice, plan: NamedPlan, n: int) -> NamedKit | None:
        """The n-th extra kit of a plan's shape, for the n+1-th call of that
        shape in a batch; None when none is kept."""
        if plan.kit.bytes > REPLICA_BYTES or n > REPLICAS:
            return None
        shape = plan.shape + (n,)
        self.held.add(shape)
        kit = self._replicas.get(shape)
        if kit is None or not kit.live:
            kit = self._replicas[shape] = NamedKit(device, plan.layouts, plan.bound, plan.gas_group)
            for old in [s for s in self._replicas if s not in self.held][: max(len(self._replicas) - REPLICAS, 0)]:
                self._replicas.pop(old).release()
        self._replicas.move_to_end(shape)
        return kit

    def batch_staging(self, device: wgpu.GPUDevice, size: int) -> wgpu.GPUBuffer | None:
        """One staging buffer of at least ``size`` bytes for a batch's
        copies (named_batch.py): kept, grown in powers of two up to
        BATCH_STAGING; None past it (the batch maps each kit's own)."""
        if size > BATCH_STAGING:
            return None
        if self._staging is None or self._staging.size < size:
            if self._staging is not None:
                self._staging.destroy()
            self._staging = device.create_buffer(size=max(4096, 1 << (size - 1).bit_length()),
                                                 usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
                                                 label="kem-named-batch-staging")
        return self._staging

    def drop(self, key: tuple) -> None:
        """Release the kits of a kernel, entry point and constants set (key:
        a shape's first three), whose state a GPU error left unknown."""
        for kits in (self._kits, self._replicas):
            for shape in [s for s in kits if s[: len(key)] == key and s not in self.held]:
                kits.pop(shape).release()
