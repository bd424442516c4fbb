"""The batch hot path on wgpu-native's C API, through wgpu-py's own cffi handle.

Why: a lone 4-byte call cost 170 us p50 through wgpu-py's objects on the
H100 and 111 us through the same native calls made here (scripts/
bench_native.py, one run, 2,000 calls each, interleaved; lavapipe 226 ->
127 us). The difference is wrapper work per native call: argument checks,
a struct built per call, an error capture per call, promise machinery and
an extra empty submit per map. Here the descriptors are built once per
device, errors are captured only around the calls that report them
synchronously (the encoder's come at ``finish``), and the map is polled
directly, with a submission index so a blocking poll waits for one batch.

Every wgpu-py private member this needs is reached through
gpu/wgpu_private.py (``handle``, ``native_api``, ``ErrorCapture``) and
checked by its ``missing_members``; gpu/hot_path.py falls back to wgpu-py's
objects when any is missing. Native pointers borrowed from wgpu-py objects
are never released here: wgpu-py owns them. What this module creates
(encoders, passes, command buffers) it releases itself.
"""

from __future__ import annotations

import time
from typing import Any

import wgpu

from kem_port.gpu.wgpu_private import MAP_CALLBACK, ErrorCapture, handle, missing_handles, native_api


class NativeMap:
    """One pending map of a staging buffer: the callback sets `status`."""

    __slots__ = ("status", "message", "handle")

    def __init__(self) -> None:
        self.status = 0  # 0 = pending, else a WGPUMapAsyncStatus
        self.message = ""
        self.handle = None  # the cffi handle that names this object to the callback

    @property
    def pending(self) -> bool:
        return self.status == 0


class NativeEncoder:
    """One command encoder and at most one open compute pass, on raw handles.

    Errors raised by wgpu-native while encoding are deferred by WebGPU to
    ``finish``, which is where this class raises them as wgpu.GPUError.
    """

    __slots__ = ("_path", "_encoder", "_pass", "_lib")

    def __init__(self, path: NativePath) -> None:
        self._path = path
        self._lib = path.lib
        self._pass = None
        self._encoder = path.errors.call(self._lib.wgpuDeviceCreateCommandEncoder, path.device_handle, path.encoder_desc)

    def clear_buffer(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> None:
        self._lib.wgpuCommandEncoderClearBuffer(self._encoder, handle(buffer), offset, size)

    def begin_pass(self, timestamps: wgpu.GPUQuerySet | None = None) -> None:
        if timestamps is None:
            desc = self._path.pass_desc
        else:
            desc = self._path.timed_pass_desc
            desc.timestampWrites.querySet = handle(timestamps)
        self._pass = self._lib.wgpuCommandEncoderBeginComputePass(self._encoder, desc)

    def set_pipeline(self, pipeline: wgpu.GPUComputePipeline) -> None:
        self._lib.wgpuComputePassEncoderSetPipeline(self._pass, handle(pipeline))

    def set_bind_group(self, group: wgpu.GPUBindGroup, index: int = 0) -> None:
        self._lib.wgpuComputePassEncoderSetBindGroup(self._pass, index, handle(group), 0, self._path.ffi.NULL)

    def dispatch(self, x: int, y: int = 1, z: int = 1) -> None:
        self._lib.wgpuComputePassEncoderDispatchWorkgroups(self._pass, x, y, z)

    def dispatch_each(self, groups: list, x: int, y: int, z: int) -> None:
        """set_bind_group and dispatch for each bind group, same workgroups
        (a group job's slots): the per-call loop with nothing looked up in it."""
        set_group, dispatch = self._lib.wgpuComputePassEncoderSetBindGroup, self._lib.wgpuComputePassEncoderDispatchWorkgroups
        pass_, null = self._pass, self._path.ffi.NULL
        for group in groups:
            set_group(pass_, 0, handle(group), 0, null)
            dispatch(pass_, x, y, z)

    def end_pass(self) -> None:
        self._lib.wgpuComputePassEncoderEnd(self._pass)
        self._lib.wgpuComputePassEncoderRelease(self._pass)
        self._pass = None

    def copy(self, source: wgpu.GPUBuffer, source_offset: int, dest: wgpu.GPUBuffer, dest_offset: int, size: int) -> None:
        self._lib.wgpuCommandEncoderCopyBufferToBuffer(
            self._encoder, handle(source), source_offset, handle(dest), dest_offset, size
        )

    def resolve_queries(self, query_set: wgpu.GPUQuerySet, count: int, dest: wgpu.GPUBuffer, offset: int) -> None:
        self._lib.wgpuCommandEncoderResolveQuerySet(self._encoder, handle(query_set), 0, count, handle(dest), offset)

    def finish(self) -> Any:
        """The command buffer handle (submit it with NativePath.submit)."""
        try:
            if self._pass is not None:
                self.end_pass()
            return self._path.errors.call(self._lib.wgpuCommandEncoderFinish, self._encoder, self._path.command_desc)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Release the native encoder (and pass) without finishing."""
        if self._pass is not None:
            self._lib.wgpuComputePassEncoderRelease(self._pass)
            self._pass = None
        if self._encoder is not None:
            self._lib.wgpuCommandEncoderRelease(self._encoder)
            self._encoder = None


class NativePath:
    """The C-API hot path of one device: write, encode, submit, wait, read.

    Built once per device (descriptors and the map callback live as long as
    it does). Not thread-safe: one thread drives a device's batches, as the
    executor already guarantees with its lock.
    """

    def __init__(self, device: wgpu.GPUDevice) -> None:
        gone = missing_handles([device, device.queue])
        if gone:
            raise RuntimeError(f"wgpu-py changed: missing {', '.join(gone)}")
        self.ffi, self.lib = native_api()
        ffi, lib = self.ffi, self.lib
        self.errors = ErrorCapture()
        self.device = device
        self.device_handle = handle(device)
        self.queue_handle = handle(device.queue)
        self.encoder_desc = ffi.new("WGPUCommandEncoderDescriptor *")
        self.command_desc = ffi.new("WGPUCommandBufferDescriptor *")
        self.pass_desc = ffi.new("WGPUComputePassDescriptor *")
        self.timed_pass_desc = ffi.new("WGPUComputePassDescriptor *")
        self._timestamps = ffi.new("WGPUPassTimestampWrites *")
        self._timestamps.beginningOfPassWriteIndex = 0
        self._timestamps.endOfPassWriteIndex = 1
        self.timed_pass_desc.timestampWrites = self._timestamps
        self._commands = ffi.new("WGPUCommandBuffer[1]")
        self._index = ffi.new("WGPUSubmissionIndex *")
        self._on_map = ffi.callback(MAP_CALLBACK)(self._map_done)
        self._map_info = ffi.new("WGPUBufferMapCallbackInfo *")
        self._map_info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self._map_info.callback = self._on_map
        self._success = lib.WGPUMapAsyncStatus_Success
        self._pending: set[NativeMap] = set()

    # -- the stages -----------------------------------------------------------

    def write(self, buffer: wgpu.GPUBuffer, offset: int, data, size: int | None = None) -> None:
        """queue.write_buffer without a copy of `data` on the Python side
        (any buffer-protocol object; wgpu-native copies it into its staging).
        Bounds are the caller's to keep; wgpu-native validates them too."""
        view = self.ffi.from_buffer(data)
        length = len(view) if size is None else size
        if length:
            self.errors.call(self.lib.wgpuQueueWriteBuffer, self.queue_handle, handle(buffer), offset, view, length)

    def encoder(self) -> NativeEncoder:
        return NativeEncoder(self)

    def submit(self, commands) -> int:
        """Submit one command buffer (and release it); returns its
        submission index, which `wait` can block on alone."""
        self._commands[0] = commands
        try:
            return self.errors.call(self.lib.wgpuQueueSubmitForIndex, self.queue_handle, 1, self._commands)
        finally:
            self.lib.wgpuCommandBufferRelease(commands)

    def discard(self, commands) -> None:
        """Release a command buffer that will not be submitted."""
        self.lib.wgpuCommandBufferRelease(commands)

    def map_read(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> NativeMap:
        """Ask for a read map of a staging buffer; done once `wait` returns."""
        return self._map(buffer, self.lib.WGPUMapMode_Read, offset, size)

    def map_write(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> NativeMap:
        """Ask for a write map of an upload buffer (MAP_WRITE | COPY_SRC)."""
        return self._map(buffer, self.lib.WGPUMapMode_Write, offset, size)

    def _map(self, buffer: wgpu.GPUBuffer, mode: int, offset: int, size: int) -> NativeMap:
        """The map's object stays in `_pending` until its callback has run:
        wgpu-native calls back with its handle even for a map nobody waits
        for any more (a failed batch, a lost device), and a handle whose
        object was collected would crash the port."""
        mapping = NativeMap()
        mapping.handle = self.ffi.new_handle(mapping)
        self._pending.add(mapping)
        info = self._map_info
        info.userdata1 = mapping.handle
        self.errors.call(self.lib.wgpuBufferMapAsync, handle(buffer), mode, offset, size, info[0])
        return mapping

    def wait_idle_map(self, mapping: NativeMap, spin_s: float = 0.002) -> None:
        """Wait for the map of a buffer the GPU is not using: non-blocking
        polls (work of other batches still in flight is not waited for),
        then, if the map has still not come, a blocking one."""
        deadline = time.perf_counter() + spin_s
        while mapping.pending and time.perf_counter() < deadline:
            self.poll(False)
        while mapping.pending:
            self.poll(True)
        if mapping.status != self._success:
            raise wgpu.GPUError(f"map failed (status {mapping.status}): {mapping.message or 'no detail'}")

    def _map_done(self, status, message, userdata1, userdata2) -> None:
        mapping = self.ffi.from_handle(userdata1)
        if status != self._success and message.data != self.ffi.NULL:
            mapping.message = self.ffi.string(message.data, message.length).decode("utf-8", "replace")
        mapping.status = status
        mapping.handle = None
        self._pending.discard(mapping)

    def poll(self, block: bool, index: int | None = None) -> None:
        """One device poll; runs map callbacks. Blocking with `index` waits
        for that submission only (wgpu-py's own poll waits for all)."""
        if index is None:
            self.lib.wgpuDevicePoll(self.device_handle, block, self.ffi.NULL)
        else:
            self._index[0] = index
            self.lib.wgpuDevicePoll(self.device_handle, block, self._index)

    def wait(self, mapping: NativeMap, spin_s: float, index: int | None = None) -> bool:
        """Spin on non-blocking polls for up to spin_s, then block until the
        map is done (docs/executor.md, "Waiting for the GPU"). Returns
        whether it had to block; raises wgpu.GPUError if the map failed."""
        if mapping.status == 0 and spin_s > 0:
            self._spin(mapping, spin_s)
        blocked = mapping.pending
        while mapping.pending:
            self.poll(True, index)
            index = None  # the submission is done; a further wait is for the map alone
        if mapping.status != self._success:
            raise wgpu.GPUError(f"map failed (status {mapping.status}): {mapping.message or 'no detail'}")
        return blocked

    def _spin(self, mapping: NativeMap, spin_s: float) -> None:
        """Non-blocking polls until the map is done or spin_s has passed.
        The loop holds its names in locals and reads the deadline once per
        8 polls: a lone call's spin polls ~40 times on lavapipe (cProfile),
        and each Python call in the loop delays seeing the completion."""
        poll, device, null, clock = self.lib.wgpuDevicePoll, self.device_handle, self.ffi.NULL, time.perf_counter
        deadline = clock() + spin_s
        while True:
            for _ in range(8):
                poll(device, False, null)
                if mapping.status != 0:
                    return
            if clock() >= deadline:
                return

    def mapped(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> memoryview:
        """The mapped bytes, without a copy. The view dies at `unmap`:
        copy or write out what must outlive it first."""
        pointer = self.lib.wgpuBufferGetConstMappedRange(handle(buffer), offset, size)
        if pointer == self.ffi.NULL:
            raise wgpu.GPUError("the staging buffer is not mapped for that range")
        return memoryview(self.ffi.buffer(pointer, size))

    def writable(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> memoryview:
        """The write-mapped bytes of an upload buffer, to fill in place (for
        instance with os.readv from a shared-memory file: one copy, and a
        file that shrinks gives a short read, not SIGBUS). Dies at `unmap`."""
        pointer = self.lib.wgpuBufferGetMappedRange(handle(buffer), offset, size)
        if pointer == self.ffi.NULL:
            raise wgpu.GPUError("the upload buffer is not mapped for that range")
        return memoryview(self.ffi.buffer(pointer, size))

    def unmap(self, buffer: wgpu.GPUBuffer) -> None:
        self.errors.call(self.lib.wgpuBufferUnmap, handle(buffer))
