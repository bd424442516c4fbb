"""A lone call's kit: everything a call of one shape needs, made once.

A kit (made by gpu/lone_road.py for a lone call the reader runs) holds its
own input, output, uniform and staging buffers, the bind group over them,
the workgroups, prebuilt cffi structs and one cffi handle for its map
callback. A call on it is wgpu-native's C API and nothing else: write the
input, zero the output, one encoder (pass, pipeline, bind group, dispatch,
end, copy, finish), submit, map, spin, read, unmap; no per-call objects
beyond what the C API needs (docs/executor.md, "The lone kit").

Every output is zeroed before the pass (a queue write from one buffer of
zeros, as the batch road does up to 64 KiB): a kernel that skips elements
returns zeros, never the previous caller's bytes. A kit is not
thread-safe; lone_road.LoneRoad runs one call at a time on it.
"""

from __future__ import annotations

from typing import Any

import wgpu

from kem_port.gpu import contract
from kem_port.gpu.native import NativePath
from kem_port.gpu.wgpu_private import MAP_CALLBACK, handle

# Kits whose map may still call back. wgpu-native calls a map's callback
# with its handle even when nobody waits any more (a call that failed
# between its map and its wait, a lost device); the object behind the
# handle must still be alive then, or the port crashes.
_awaiting: set[Kit] = set()
_on_map: Any = None  # the one map callback of the process (never freed: maps may outlive a road)


def _map_callback(ffi) -> Any:
    global _on_map
    if _on_map is None:
        def done(status, message, userdata1, userdata2) -> None:
            ffi.from_handle(userdata1).map_done(status, message)

        _on_map = ffi.callback(MAP_CALLBACK)(done)
    return _on_map


class Kit:
    """Everything a call of one shape needs, made once; see the module doc."""

    __slots__ = (
        "path", "ffi", "lib", "pipeline", "groups", "groups_from_params", "entry", "limits",
        "in_len", "in_size", "out_len", "out_size", "params_len", "u_size",
        "buffers", "in_buf", "out_buf", "u_buf", "staging", "group",
        "in_pad", "u_pad", "zeros", "commands", "map_info", "handle",
        "status", "message", "pipeline_h", "group_h", "device_h", "queue_h",
        "in_h", "out_h", "u_h", "staging_h", "success",
    )

    def __init__(self, path: NativePath, device: wgpu.GPUDevice, prepared, call, limits, zeros) -> None:
        self.path, self.ffi, self.lib = path, path.ffi, path.lib
        self.pipeline, self.groups, self.limits = prepared.pipeline, prepared.groups, limits
        self.entry = entry = prepared.pipeline.entry
        wide = entry is not None and entry.workgroup_size is not None and entry.workgroup_size[1] > 1
        # plan_dispatch reads the params' words only for a 2-D workgroup (an image's size)
        self.groups_from_params = call.params is not None and wide
        self.in_len, self.in_size = len(call.input), prepared.in_size
        self.out_len, self.out_size = call.output_size, prepared.out_size
        self.params_len = -1 if call.params is None else len(call.params)
        self.u_size = prepared.u_size
        self.zeros = zeros
        self._make_buffers(device)
        self._make_structs()

    def _make_buffers(self, device: wgpu.GPUDevice) -> None:
        """The kit's own buffers, exactly the bound sizes, and the bind group over them."""
        usage = wgpu.BufferUsage
        self.in_buf = device.create_buffer(size=self.in_size, usage=usage.STORAGE | usage.COPY_DST, label="kem-lone-input")
        self.out_buf = device.create_buffer(
            size=self.out_size, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST, label="kem-lone-output"
        )
        self.staging = device.create_buffer(size=self.out_size, usage=usage.MAP_READ | usage.COPY_DST, label="kem-lone-staging")
        self.u_buf = None
        params = None
        if self.u_size:
            self.u_buf = device.create_buffer(size=self.u_size, usage=usage.UNIFORM | usage.COPY_DST, label="kem-lone-params")
            params = (self.u_buf, 0, self.u_size)
        self.buffers = [b for b in (self.in_buf, self.out_buf, self.staging, self.u_buf) if b is not None]
        self.group = device.create_bind_group(
            layout=self.pipeline.layout,
            entries=contract.group_entries((self.in_buf, 0, self.in_size), (self.out_buf, 0, self.out_size), params),
        )

    def _make_structs(self) -> None:
        """The cffi structs and native handles every call reuses."""
        ffi, lib, path = self.ffi, self.lib, self.path
        # An input or params whose length is not a whole number of words is
        # copied into a buffer of the bound size first (queue writes are in
        # words); its tail past the length is never written, so it stays zero.
        self.in_pad = ffi.new("uint8_t[]", self.in_size) if self.in_len % 4 else None
        self.u_pad = ffi.new("uint8_t[]", self.u_size) if self.u_size else None
        self.commands = ffi.new("WGPUCommandBuffer[1]")
        self.handle = ffi.new_handle(self)  # names this kit to the map callback, for its whole life
        self.map_info = ffi.new("WGPUBufferMapCallbackInfo *")
        self.map_info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self.map_info.callback = _map_callback(ffi)
        self.map_info.userdata1 = self.handle
        self.status = self.success = lib.WGPUMapAsyncStatus_Success  # no map pending
        self.message = ""
        self.device_h, self.queue_h = path.device_handle, path.queue_handle
        self.pipeline_h, self.group_h = handle(self.pipeline.pipeline), handle(self.group)
        self.in_h, self.out_h, self.staging_h = handle(self.in_buf), handle(self.out_buf), handle(self.staging)
        self.u_h = handle(self.u_buf) if self.u_buf is not None else None

    # -- one call -------------------------------------------------------------

    def encode(self, data, params: bytes | None, groups: tuple[int, int, int]) -> None:
        """Write the input (and params), zero the output, record the pass and
        the copy to staging: self.commands[0] holds the command buffer."""
        ffi, lib, queue = self.ffi, self.lib, self.queue_h
        if self.in_len:
            if self.in_pad is None:
                lib.wgpuQueueWriteBuffer(queue, self.in_h, 0, ffi.from_buffer(data), self.in_len)
            else:
                ffi.memmove(self.in_pad, data, self.in_len)
                lib.wgpuQueueWriteBuffer(queue, self.in_h, 0, self.in_pad, self.in_size)
        if self.u_pad is not None:
            ffi.memmove(self.u_pad, params, self.params_len)
            lib.wgpuQueueWriteBuffer(queue, self.u_h, 0, self.u_pad, self.u_size)
        lib.wgpuQueueWriteBuffer(queue, self.out_h, 0, self.zeros, self.out_size)
        path = self.path
        encoder = lib.wgpuDeviceCreateCommandEncoder(self.device_h, path.encoder_desc)
        try:
            compute = lib.wgpuCommandEncoderBeginComputePass(encoder, path.pass_desc)
            lib.wgpuComputePassEncoderSetPipeline(compute, self.pipeline_h)
            lib.wgpuComputePassEncoderSetBindGroup(compute, 0, self.group_h, 0, ffi.NULL)
            lib.wgpuComputePassEncoderDispatchWorkgroups(compute, *groups)
            lib.wgpuComputePassEncoderEnd(compute)
            lib.wgpuComputePassEncoderRelease(compute)
            lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, self.out_h, 0, self.staging_h, 0, self.out_size)
            self.commands[0] = lib.wgpuCommandEncoderFinish(encoder, path.command_desc)
        finally:
            lib.wgpuCommandEncoderRelease(encoder)

    def submit(self) -> int:
        """Submit the command buffer (and release it), then ask for the map."""
        lib = self.lib
        try:
            index = lib.wgpuQueueSubmitForIndex(self.queue_h, 1, self.commands)
        finally:
            self.discard()
        self.status = 0
        _awaiting.add(self)
        lib.wgpuBufferMapAsync(self.staging_h, lib.WGPUMapMode_Read, 0, self.out_size, self.map_info[0])
        return index

    def discard(self) -> None:
        """Release a command buffer that will not be submitted."""
        commands = self.commands[0]
        if commands != self.ffi.NULL:
            self.commands[0] = self.ffi.NULL
            self.lib.wgpuCommandBufferRelease(commands)

    @property
    def pending(self) -> bool:
        return self.status == 0

    def wait(self, spin_s: float, index: int) -> bool:
        """Spin, then block for this submission, as any map of the C-API
        path waits (a kit has the `status`, `pending` and `message` of a
        NativeMap). Returns whether it had to block; raises wgpu.GPUError
        if the map failed."""
        return self.path.wait(self, spin_s, index)

    def map_done(self, status, message) -> None:
        ffi = self.ffi
        if status != self.success and message.data != ffi.NULL:
            self.message = ffi.string(message.data, message.length).decode("utf-8", "replace")
        self.status = status
        _awaiting.discard(self)

    def read(self) -> bytes:
        """The caller's bytes out of the mapped staging buffer, then unmap."""
        lib = self.lib
        try:
            pointer = lib.wgpuBufferGetConstMappedRange(self.staging_h, 0, self.out_size)
            if pointer == self.ffi.NULL:
                raise wgpu.GPUError("the lone call's staging buffer is not mapped")
            return self.ffi.buffer(pointer, self.out_len)[:]
        finally:
            lib.wgpuBufferUnmap(self.staging_h)

    def retire(self) -> None:
        """Free the buffers of a kit no call will use again (an idle one:
        a kit whose map may still call back is kept alive by _awaiting)."""
        if self.status != 0:
            for buf in self.buffers:
                buf.destroy()
        self.buffers = []
