"""A named-buffer call's kit: the buffers, bind groups and staging buffer of
one call shape (kernel, entry point, each binding's role and size), made
once and reused by every call of that shape (gpu/named/named_run.py keeps
them in a small LRU), as the lone call's kit is (gpu/lone_kit.py).

Every call overwrites everything a kernel can read before it runs: each
input, uniform and in/out buffer is written whole (the caller's bytes, then
zeros to the bound size) and each output is cleared by the encoder, so a
call never sees a previous caller's bytes. Fresh buffers a call cost a
4-byte call ~2x a kem@1.0 call on lavapipe (797 against 298 us p50).

A looping kernel's kit holds its gas cap and meter too (named_gas.py), 16
bytes each, bound at the kernel's gas group: the cap written and the meter
cleared each call, the meter copied to the staging buffer after the
outputs, so it comes back in the same map as they do.
"""

from __future__ import annotations

import wgpu

from kem_port.gpu.hot_path import HotPath, write_whole
from kem_port.gpu.native import NativePath
from kem_port.gpu.wgpu_private import ErrorCapture, handle
from kem_port.gpu.named.binding_model import Bound
from kem_port.gpu.wgsl import wgsl_gas

_U = wgpu.BufferUsage


class NamedKit:
    """Buffers and bind groups for one call shape; not thread-safe (the GPU
    thread, or the reader holding the executor lock, runs one call at a time)."""

    def __init__(self, device: wgpu.GPUDevice, layouts: dict, bound: list[Bound], gas_group: int | None = None) -> None:
        self.buffers = [self._buffer(device, x) for x in bound]
        self.groups = {
            group: device.create_bind_group(layout=layout, entries=[
                {"binding": x.binding.binding, "resource": {"buffer": buf, "offset": 0, "size": x.size}}
                for x, buf in zip(bound, self.buffers) if x.binding.group == group])
            for group, layout in layouts.items() if group != gas_group
        }
        self.returned = [(i, x) for i, x in enumerate(bound) if x.returned]
        self.offsets, total = [], 0
        for _, x in self.returned:
            self.offsets.append(total)
            total += x.size  # sizes are whole words: every offset is 4-aligned, as copies need
        self.gas: tuple[wgpu.GPUBuffer, wgpu.GPUBuffer] | None = None
        self.meter_offset = total
        if gas_group is not None:
            self.gas = (device.create_buffer(size=wgsl_gas.CAP_BYTES, usage=_U.UNIFORM | _U.COPY_DST, label="kem-gas-cap"),
                        device.create_buffer(size=wgsl_gas.METER_BYTES, usage=_U.STORAGE | _U.COPY_SRC | _U.COPY_DST,
                                             label="kem-gas-meter"))
            self.groups[gas_group] = device.create_bind_group(layout=layouts[gas_group], entries=[
                {"binding": wgsl_gas.CAP_BINDING, "resource": {"buffer": self.gas[0], "offset": 0, "size": wgsl_gas.CAP_BYTES}},
                {"binding": wgsl_gas.METER_BINDING, "resource": {"buffer": self.gas[1], "offset": 0, "size": wgsl_gas.METER_BYTES}}])
            total += wgsl_gas.METER_BYTES
        self.staging_size = max(total, 4)
        self.staging = device.create_buffer(size=self.staging_size, usage=_U.MAP_READ | _U.COPY_DST, label="kem-named-staging")
        self.bytes = sum(x.size for x in bound) + total
        # Outputs are cleared each call, whatever the last call left; the meter counts from zero.
        self.clears = [(buf, x.size) for x, buf in zip(bound, self.buffers) if x.role == "output"]
        self.copies = [(self.buffers[i], offset, x.size) for (i, x), offset in zip(self.returned, self.offsets)]
        if self.gas is not None:
            self.clears.append((self.gas[1], wgsl_gas.METER_BYTES))
            self.copies.append((self.gas[1], self.meter_offset, wgsl_gas.METER_BYTES))
        self.native: _Handles | None = None  # the C API's handles, on its first native call
        self.live = True  # False once released: a plan holding this kit makes a new one

    @staticmethod
    def _buffer(device: wgpu.GPUDevice, x: Bound) -> wgpu.GPUBuffer:
        usage = (_U.UNIFORM if x.role == "uniform" else _U.STORAGE | _U.COPY_SRC) | _U.COPY_DST
        return device.create_buffer(size=x.size, usage=usage, label=f"kem-named-{x.binding.name}")

    def run(self, path: HotPath, pipeline: wgpu.GPUComputePipeline, bound: list[Bound], datas: list[bytes | None],
            groups: tuple[int, int, int], spin_s: float, cap: int = 0) -> tuple[dict[str, bytes], tuple[int, ...] | None]:
        """One call of this shape: ``datas`` are its bytes in binding order
        (None for an output), ``bound`` its bindings (their lengths are this
        call's; one kit serves every length that pads to its sizes). Returns
        its returned buffers by WGSL name, and the meter's four words (None:
        unmetered) with ``cap`` loop iterations per invocation."""
        if isinstance(path, NativePath):
            # One error capture for the writes and the encoding (each native
            # call in its own cost ~2-5 us on the dev machine); finish and
            # submit raise what wgpu-native reported before anything runs.
            commands = path.errors.call(self._encode_native, path, pipeline, bound, datas, groups, cap)
        else:
            commands = ErrorCapture().call(self._encode, path, pipeline, bound, datas, groups, cap)
        index = path.submit(commands)
        mapping = path.map_read(self.staging, 0, self.staging_size)
        path.wait(mapping, spin_s, index)
        return self.read(path, bound)

    def read(self, path: HotPath, bound: list[Bound]) -> tuple[dict[str, bytes], tuple[int, ...] | None]:
        """The returned buffers by name and the meter's words, off the mapped
        staging buffer, which is then unmapped."""
        try:
            return self.parse(path.mapped(self.staging, 0, self.staging_size), 0, bound)
        finally:
            path.unmap(self.staging)

    def parse(self, view: memoryview, base: int, bound: list[Bound]) -> tuple[dict[str, bytes], tuple[int, ...] | None]:
        """The returned buffers by name and the meter's words, copied out of
        a staging view where this kit's copies landed at ``base``."""
        returned = {bound[i].binding.name: bytes(view[base + offset : base + offset + bound[i].logical])
                    for (i, _), offset in zip(self.returned, self.offsets)}
        at = base + self.meter_offset
        words = None if self.gas is None else tuple(view[at : at + wgsl_gas.METER_BYTES].cast("I"))
        return returned, words

    def _encode(self, path: HotPath, pipeline: wgpu.GPUComputePipeline, bound: list[Bound], datas: list[bytes | None],
                groups: tuple[int, int, int], cap: int):
        """Write the inputs and the gas cap, clear the outputs and the meter,
        the pass, the copies to staging: the command buffer, through the hot
        path's encoder (the wrappers)."""
        for buf, data, x in zip(self.buffers, datas, bound):
            if data is not None:
                write_whole(path, buf, data, x.size)
        if self.gas is not None:
            path.write(self.gas[0], 0, _cap_bytes(cap))
        encoder = path.encoder()
        try:
            for buf, size in self.clears:
                encoder.clear_buffer(buf, 0, size)
            encoder.begin_pass()
            encoder.set_pipeline(pipeline)
            for group, bind_group in self.groups.items():
                encoder.set_bind_group(bind_group, group)
            encoder.dispatch(*groups)
            encoder.end_pass()
            for buf, offset, size in self.copies:
                encoder.copy(buf, 0, self.staging, offset, size)
            return encoder.finish()
        except BaseException:
            encoder.abandon()
            raise

    def _encode_native(self, path: NativePath, pipeline: wgpu.GPUComputePipeline, bound: list[Bound],
                       datas: list[bytes | None], groups: tuple[int, int, int], cap: int):
        """_encode in bare C calls on handles taken once (as the lone kit
        encodes, gpu/lone_kit.py): the wrappers' encoder cost a 4-byte call
        ~10 Python calls and 5 error captures. Run inside one capture
        (wgpu-native defers encoding errors to finish)."""
        self.write_native(path, bound, datas, cap)
        lib = path.lib
        encoder = lib.wgpuDeviceCreateCommandEncoder(path.device_handle, path.encoder_desc)
        try:
            self.clear_native(lib, encoder)
            compute = lib.wgpuCommandEncoderBeginComputePass(encoder, path.pass_desc)
            self.dispatch_native(path, compute, pipeline, groups)
            lib.wgpuComputePassEncoderEnd(compute)
            lib.wgpuComputePassEncoderRelease(compute)
            self.copy_native(lib, encoder)
            return lib.wgpuCommandEncoderFinish(encoder, path.command_desc)
        finally:
            lib.wgpuCommandEncoderRelease(encoder)

    # The parts of a native call, for one call (above) or many in one
    # submission (named_batch.py); each runs inside the caller's capture.

    def write_native(self, path: NativePath, bound: list[Bound], datas: list[bytes | None], cap: int) -> None:
        """Queue writes of the call's bytes (as _write: whole words, then the
        tail joined to its zeros) and the gas cap."""
        if self.native is None:
            self.native = _Handles(self)
        lib, ffi, h, queue = path.lib, path.ffi, self.native, path.queue_handle
        for buf, data, x in zip(h.buffers, datas, bound):
            if data is not None:
                whole = len(data) & ~3  # as write_whole, in bare C calls under the caller's one capture
                if whole:
                    lib.wgpuQueueWriteBuffer(queue, buf, 0, ffi.from_buffer(data), whole)
                if whole < x.size:
                    tail = data[whole:] + bytes(x.size - len(data))
                    lib.wgpuQueueWriteBuffer(queue, buf, whole, ffi.from_buffer(tail), len(tail))
        if h.cap is not None:
            lib.wgpuQueueWriteBuffer(queue, h.cap, 0, ffi.from_buffer(_cap_bytes(cap)), wgsl_gas.CAP_BYTES)

    def clear_native(self, lib, encoder) -> None:
        for buf, size in self.native.clears:
            lib.wgpuCommandEncoderClearBuffer(encoder, buf, 0, size)

    def dispatch_native(self, path: NativePath, compute, pipeline: wgpu.GPUComputePipeline, groups: tuple[int, int, int]) -> None:
        lib, null = path.lib, path.ffi.NULL
        lib.wgpuComputePassEncoderSetPipeline(compute, handle(pipeline))
        for index, group in self.native.groups:
            lib.wgpuComputePassEncoderSetBindGroup(compute, index, group, 0, null)
        lib.wgpuComputePassEncoderDispatchWorkgroups(compute, *groups)

    def copy_native(self, lib, encoder, staging=None, base: int = 0) -> None:
        """Copy what comes back to this kit's staging, or to ``staging`` (a
        batch's, named_batch.py) from ``base`` on."""
        h = self.native
        staging = h.staging if staging is None else staging
        for buf, offset, size in h.copies:
            lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, buf, 0, staging, base + offset, size)

    def release(self) -> None:
        self.live = False
        for buf in (*self.buffers, *(self.gas or ()), self.staging):
            buf.destroy()


def _cap_bytes(cap: int) -> bytes:
    return cap.to_bytes(4, "little") + bytes(wgsl_gas.CAP_BYTES - 4)


class _Handles:
    """A kit's native handles (owned by its wgpu-py objects, which it keeps)."""

    __slots__ = ("buffers", "cap", "clears", "copies", "groups", "staging")

    def __init__(self, kit: NamedKit) -> None:
        self.buffers = [handle(buf) for buf in kit.buffers]
        self.cap = None if kit.gas is None else handle(kit.gas[0])
        self.clears = [(handle(buf), size) for buf, size in kit.clears]
        self.copies = [(handle(buf), offset, size) for buf, offset, size in kit.copies]
        self.groups = [(index, handle(group)) for index, group in kit.groups.items()]
        self.staging = handle(kit.staging)
