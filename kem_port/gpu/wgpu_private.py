"""Every wgpu-py private member kem uses, behind functions that say what they do.

wgpu-py 0.32 makes neither a non-blocking device poll, nor a map
promise's readiness, nor a map that skips its own device sync public; kem
needs all three on its hot path (gpu/wait.py, docs/executor.md). They are
used nowhere else, pinned by the ``wgpu>=0.32,<0.33`` requirement, and
:func:`missing_members` names any that an upgrade removed
(tests/test_wgpu_private.py fails on it).

kem also tags the buffers it creates with a serial number (an attribute of
its own on wgpu's buffer object): it lives here too, so every liberty kem
takes with wgpu's objects is in one file.
"""

from __future__ import annotations

import inspect

import wgpu
from wgpu.backends.wgpu_native import GPUBuffer, GPUDevice

# Members this module relies on, by the name wgpu-py gives them.
MEMBERS = (
    "GPUDevice._poll",
    "GPUDevice._poll_wait",
    "GPUPromise._state",
    'GPUBuffer.map_async("READ_NOSYNC")',
)

_SERIAL_ATTR = "kem_serial"


def poll_without_blocking(device: wgpu.GPUDevice) -> None:
    """Run the callbacks of finished GPU work (a buffer map) and return at once."""
    device._poll(False)


def poll_until_idle(device: wgpu.GPUDevice) -> None:
    """Block until the GPU has finished everything submitted, running the
    callbacks on this thread (measured 1.6x faster than map_sync on
    lavapipe, which waits on wgpu-py's poller thread; docs/executor.md)."""
    device._poll_wait()


def is_pending(promise) -> bool:
    """Whether a map promise has not resolved yet."""
    return promise._state == "pending"


def map_for_reading_unsynced(buffer: wgpu.GPUBuffer, size: int):
    """Map a staging buffer for reading without wgpu-py's own device sync
    (kem waits for it in gpu/wait.py); returns the map's promise."""
    return buffer.map_async("READ_NOSYNC", 0, size)


def tag_serial(buffer: wgpu.GPUBuffer, serial: int) -> None:
    """Give a buffer a serial number that is never reused (unlike id()), so
    objects that refer to it (bind groups) can be cached by it."""
    setattr(buffer, _SERIAL_ATTR, serial)


def serial_of(buffer: wgpu.GPUBuffer) -> int:
    return getattr(buffer, _SERIAL_ATTR)


def missing_members() -> list[str]:
    """The members of MEMBERS this wgpu-py lacks (empty when all are there)."""
    missing = []
    for cls, name in ((GPUDevice, "_poll"), (GPUDevice, "_poll_wait")):
        if not callable(getattr(cls, name, None)):
            missing.append(f"{cls.__name__}.{name}")
    promise = wgpu.GPUPromise("kem-probe", None)
    if not isinstance(getattr(promise, "_state", None), str):
        missing.append("GPUPromise._state")
    if "READ_NOSYNC" not in inspect.getsource(GPUBuffer.map_async):
        missing.append('GPUBuffer.map_async("READ_NOSYNC")')
    return missing
