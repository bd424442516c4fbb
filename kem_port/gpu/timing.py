"""GPU timestamps: how long a batch's compute pass ran on the GPU.

On real GPUs they are on by default, sampled (one batch in TIMING_EVERY:
the queries and their resolve are three more native calls). On lavapipe
they cost ~170 us of a ~700 us small call, so ``KEM_GPU_TIMING=auto``
leaves them off there; ``on`` times every batch, ``off`` none.
"""

from __future__ import annotations

import wgpu

TIMING_EVERY = 16  # with KEM_GPU_TIMING=auto, one batch in this many is timed


def wanted(mode: str, adapter: wgpu.GPUAdapter) -> bool:
    """Whether to ask the device for timestamp queries at all."""
    if mode == "off" or "timestamp-query" not in adapter.features:
        return False
    return mode == "on" or adapter.info.get("adapter_type") != "CPU"


class Timing:
    """Timestamps at the start and end of one batch's compute pass,
    resolved and copied behind the results in the staging buffer, so they
    come back with the map the batch already does."""

    size = 16

    def __init__(self, query_set, offset: int) -> None:
        self.offset = offset
        self.query_set = query_set
        self.resolved = None  # a pooled buffer the flight takes

    def resolve(self, encoder, staging) -> None:
        """On a gpu/hot_path.py encoder, after the timed pass."""
        encoder.resolve_queries(self.query_set, 2, self.resolved, 0)
        encoder.copy(self.resolved, 0, staging, self.offset, self.size)

    def read(self, mapped: memoryview) -> float:
        """Seconds of GPU time for the batch's pass, from the mapped staging."""
        begin, end = mapped[self.offset : self.offset + self.size].cast("Q")
        return max(0, end - begin) / 1e9


class Sampler:
    """Decides which batches are timed. One query set for the device's
    life: creating one per batch cost ~250 us a small call on lavapipe."""

    def __init__(self, device: wgpu.GPUDevice | None, mode: str) -> None:
        self.mode = mode
        self.query_set = device.create_query_set(type="timestamp", count=2) if device is not None else None
        self._batches = 0

    def for_batch(self, offset: int) -> Timing | None:
        """A Timing for the next batch (results end at `offset`), or None."""
        if self.query_set is None:
            return None
        self._batches += 1
        if self.mode == "on" or self._batches % TIMING_EVERY == 1:
            return Timing(self.query_set, offset)
        return None
