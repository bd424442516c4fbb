"""Waiting for a submitted batch: spin on non-blocking polls, then block.

On the NVIDIA H200 (Vulkan, driver 580) a blocking device poll issued
before the batch is done returned ~10 ms later, whatever the batch's size:
in `scripts/batch_curve.py` a lone batch waited 56-58 us when it finished at
once, 3-10 ms from 4 calls up, with the GPU busy for 25-365 us of it.
Non-blocking polls catch the completion within microseconds; past a spin
budget a blocking poll takes over, so a long kernel does not burn a core.
On a CPU adapter (lavapipe) the "GPU" is the driver's worker threads on the
same cores, so spinning would slow it: the default there is no spin.

The polls and the promise's state are wgpu-py private members, used
through gpu/wgpu_private.py.
"""

from __future__ import annotations

import time

import wgpu

from kem_port.gpu.wgpu_private import is_pending, poll_until_idle, poll_without_blocking


def wait_for_map(device: wgpu.GPUDevice, promise, spin_s: float) -> bool:
    """Return when `promise` (a buffer map after a submit) has resolved,
    with whether a blocking poll was needed; raises what the map raised."""
    if spin_s > 0 and is_pending(promise):
        deadline = time.perf_counter() + spin_s
        while True:
            poll_without_blocking(device)  # runs the map callback if the work is done
            if not is_pending(promise) or time.perf_counter() > deadline:
                break
    blocked = is_pending(promise)
    if blocked:
        poll_until_idle(device)
    promise.sync_wait()
    return blocked
