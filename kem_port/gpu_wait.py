"""Waiting for a submitted batch: spin on non-blocking polls, then block.

On the NVIDIA H200 (Vulkan, driver 580) a blocking device poll issued
before the batch is done returned ~10 ms later, whatever the batch's size:
in `scripts/batch_curve.py` a lone batch waited 56-58 us when it finished at
once, 3-10 ms from 4 calls up, with the GPU busy for 25-365 us of it.
Non-blocking polls catch the completion within microseconds; past a spin
budget a blocking poll takes over, so a long kernel does not burn a core.
On a CPU adapter (lavapipe) the "GPU" is the driver's worker threads on the
same cores, so spinning would slow it: the default there is no spin.

wgpu-py makes neither a non-blocking poll nor a map promise's readiness
public. The private members used (``GPUDevice._poll``,
``GPUDevice._poll_wait``, ``GPUPromise._state``) are held in this one file
and pinned by the ``wgpu>=0.32,<0.33`` requirement.
"""

from __future__ import annotations

import time

import wgpu


def wait_for_map(device: wgpu.GPUDevice, promise, spin_s: float) -> None:
    """Return when `promise` (a buffer map after a submit) has resolved;
    raises what the map raised."""
    if spin_s > 0 and promise._state == "pending":
        deadline = time.perf_counter() + spin_s
        while True:
            device._poll(False)  # runs the map callback if the work is done
            if promise._state != "pending" or time.perf_counter() > deadline:
                break
    if promise._state == "pending":
        # Returns when the GPU is done and runs the map callback on this
        # thread: measured 1.6x faster than map_sync on lavapipe, which
        # waits on wgpu-py's poller thread (docs/executor.md).
        device._poll_wait()
    promise.sync_wait()
