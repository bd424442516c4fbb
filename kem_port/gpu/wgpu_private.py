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

The C-API hot path (gpu/native.py) drives wgpu-native through wgpu-py's
own cffi handle: the handle, each object's native pointer (``_internal``)
and wgpu-py's error handler are reached through the functions below, and
the C functions, constants and types it calls are listed in
``NATIVE_MEMBERS``; :func:`missing_members` checks them all.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

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

# What gpu/native.py uses of wgpu-py's wgpu-native backend: module members,
# then the C functions, constants and types it calls through them.
NATIVE_MODULE_MEMBERS = (
    ("wgpu.backends.wgpu_native", "ffi"),
    ("wgpu.backends.wgpu_native", "lib"),
    ("wgpu.backends.wgpu_native._api", "error_handler"),
    ("wgpu.backends.wgpu_native._helpers", "ERROR_TYPES"),
)
NATIVE_FUNCTIONS = (
    "wgpuQueueWriteBuffer", "wgpuDeviceCreateCommandEncoder", "wgpuCommandEncoderBeginComputePass",
    "wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
    "wgpuComputePassEncoderDispatchWorkgroups", "wgpuComputePassEncoderEnd", "wgpuComputePassEncoderRelease",
    "wgpuCommandEncoderClearBuffer", "wgpuCommandEncoderCopyBufferToBuffer", "wgpuCommandEncoderResolveQuerySet",
    "wgpuCommandEncoderFinish", "wgpuCommandEncoderRelease", "wgpuCommandBufferRelease", "wgpuQueueSubmitForIndex",
    "wgpuBufferMapAsync", "wgpuDevicePoll", "wgpuBufferGetConstMappedRange", "wgpuBufferGetMappedRange",
    "wgpuBufferUnmap",
)
NATIVE_CONSTANTS = (
    "WGPUCallbackMode_AllowProcessEvents", "WGPUMapMode_Read", "WGPUMapMode_Write", "WGPUMapAsyncStatus_Success",
)
NATIVE_TYPES = (
    "WGPUCommandEncoderDescriptor *", "WGPUComputePassDescriptor *", "WGPUPassTimestampWrites *",
    "WGPUCommandBufferDescriptor *", "WGPUBufferMapCallbackInfo *", "WGPUSubmissionIndex *",
)
MAP_CALLBACK = "void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)"
# wgpu-py classes whose objects must carry their native pointer as ``_internal``.
HANDLE_CLASSES = ("GPUDevice", "GPUQueue", "GPUBuffer", "GPUComputePipeline", "GPUBindGroup", "GPUQuerySet")


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


def native_api() -> tuple[Any, Any]:
    """wgpu-py's cffi handle on wgpu-native: (ffi, lib)."""
    from wgpu.backends.wgpu_native import ffi, lib

    return ffi, lib


def handle(ob: Any) -> Any:
    """The native pointer of a wgpu-py object (owned by wgpu-py: never release it)."""
    return ob._internal


def missing_handles(objects: list[Any]) -> list[str]:
    """The objects among `objects` without a native pointer, by class."""
    return [type(ob).__name__ + "._internal" for ob in objects if getattr(ob, "_internal", None) is None]


class ErrorCapture:
    """wgpu-py's error handler, used as its own wrappers use it around a
    native call: errors wgpu-native reports during the call are raised as
    wgpu.GPUError (subclass by kind) instead of being logged."""

    def __init__(self) -> None:
        from wgpu.backends.wgpu_native._api import error_handler
        from wgpu.backends.wgpu_native._helpers import ERROR_TYPES

        self._handler = error_handler
        self._types = ERROR_TYPES

    def call(self, function, *args):
        self._handler.capture("kem")
        try:
            result = function(*args)
        finally:
            found = self._handler.release("kem")
        if found is not None:
            kind, message = found
            raise self._types.get(kind, wgpu.GPUError)(message)
        return result


def missing_native_members(types: bool = True) -> list[str]:
    """What gpu/native.py needs that this wgpu-py lacks, by name. The C type
    checks cost ~200 ms of cffi parsing on the dev machine (a port start
    pays them once the C-API path is built anyway): ``types=False`` skips
    them."""
    gone: list[str] = []
    found: dict[str, Any] = {}
    for module_name, attr in NATIVE_MODULE_MEMBERS:
        try:
            found[attr] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            gone.append(f"{module_name}.{attr}")
    handler = found.get("error_handler")
    gone += [f"error_handler.{m}" for m in ("capture", "release") if handler is not None and not callable(getattr(handler, m, None))]
    lib, ffi = found.get("lib"), found.get("ffi")
    if lib is not None:
        gone += [f"lib.{name}" for name in NATIVE_FUNCTIONS + NATIVE_CONSTANTS if not hasattr(lib, name)]
    if ffi is not None and types:
        for ctype in NATIVE_TYPES:
            try:
                ffi.typeof(ctype)
            except Exception:
                gone.append(f"ffi type {ctype!r}")
        try:
            ffi.callback(MAP_CALLBACK, lambda *args: None)
        except Exception:
            gone.append(f"ffi callback {MAP_CALLBACK!r}")
    return gone


def missing_members() -> list[str]:
    """The members of MEMBERS and NATIVE_MEMBERS this wgpu-py lacks (empty when all are there)."""
    missing = missing_native_members()
    for cls, name in ((GPUDevice, "_poll"), (GPUDevice, "_poll_wait")):
        if not callable(getattr(cls, name, None)):
            missing.append(f"{cls.__name__}.{name}")
    promise = wgpu.GPUPromise("kem-probe", None)
    if not isinstance(getattr(promise, "_state", None), str):
        missing.append("GPUPromise._state")
    if "READ_NOSYNC" not in inspect.getsource(GPUBuffer.map_async):
        missing.append('GPUBuffer.map_async("READ_NOSYNC")')
    return missing
