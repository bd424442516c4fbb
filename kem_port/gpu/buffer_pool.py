"""GPU buffers reused across calls, by kind and size class.

Creating a buffer per call costs more than a small kernel (measurements.md:
~390 us a call with fresh buffers). Buffers are kept per (kind, size class);
classes are powers of two up to 64 MiB and 16 MiB steps above, so a pool
hit wastes at most half the buffer for small calls and 16 MiB for big ones.
Idle buffers are kept only while their total stays under a byte budget;
beyond it they are destroyed on return.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict

import wgpu

from kem_port.gpu.wgpu_private import tag_serial

MiB = 1 << 20
MIN_CLASS = 256

USAGES = {
    "input": wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST,
    "output": wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST,
    "session": wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST,  # gpu/sessions.py
    "uniform": wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST,
    "table": wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST,
    "upload": wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC,
    "staging": wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
    "query": wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC,
}


def size_class(size: int, max_buffer: int) -> int:
    if size <= MIN_CLASS:
        cls = MIN_CLASS
    elif size <= 64 * MiB:
        cls = 1 << (size - 1).bit_length()
    else:
        cls = -(-size // (16 * MiB)) * (16 * MiB)
    return min(cls, max_buffer) if size <= max_buffer else size


class BufferPool:
    def __init__(self, device: wgpu.GPUDevice, budget_bytes: int, max_buffer: int) -> None:
        self._device = device
        self._budget = budget_bytes
        self._max_buffer = max_buffer
        self._idle: dict[tuple[str, int], list[wgpu.GPUBuffer]] = defaultdict(list)
        self._order: OrderedDict[int, tuple[str, int]] = OrderedDict()
        self.idle_bytes = 0
        self.live_bytes = 0
        self.allocations = 0
        self.reuses = 0

    def take(self, kind: str, size: int) -> wgpu.GPUBuffer:
        cls = size_class(size, self._max_buffer)
        free = self._idle.get((kind, cls))
        if free:
            buf = free.pop()
            self._order.pop(id(buf), None)
            self.idle_bytes -= cls
            self.reuses += 1
            return buf
        self.allocations += 1
        self.live_bytes += cls
        buf = self._device.create_buffer(size=cls, usage=USAGES[kind], label=f"kem-{kind}")
        tag_serial(buf, self.allocations)  # lets bind groups be cached by buffer
        return buf

    def give(self, kind: str, buf: wgpu.GPUBuffer) -> None:
        cls = buf.size
        while self.idle_bytes + cls > self._budget and self._order:
            self._evict_oldest()
        if self.idle_bytes + cls > self._budget:
            self._destroy(buf)
            return
        self._idle[(kind, cls)].append(buf)
        self._order[id(buf)] = (kind, cls)
        self.idle_bytes += cls

    def _evict_oldest(self) -> None:
        _, key = self._order.popitem(last=False)
        buf = self._idle[key].pop(0)
        self.idle_bytes -= key[1]
        self._destroy(buf)

    def _destroy(self, buf: wgpu.GPUBuffer) -> None:
        self.live_bytes -= buf.size
        buf.destroy()

    def clear(self) -> None:
        while self._order:
            self._evict_oldest()

    def describe(self) -> dict[str, int]:
        return {
            "pool_idle_bytes": self.idle_bytes,
            "pool_live_bytes": self.live_bytes,
            "pool_allocations": self.allocations,
            "pool_reuses": self.reuses,
        }
