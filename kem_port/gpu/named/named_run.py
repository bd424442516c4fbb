"""A call by named buffers, run in one submission on the GPU thread.

The kernel's pipeline is compiled once per (kernel sha256, entry point)
with an explicit layout read off its declarations (one bind group layout
per group it uses, each binding typed by its role: read-only storage,
storage, uniform), so the device enforces the WGSL's access modes. Each
call gets its own buffers, created for it: an input or uniform filled
from the caller's bytes, an in/out buffer too, an output zeroed by WebGPU
at creation; so a call never sees another's bytes. One encoder runs the
dispatch and copies every returned buffer into one staging buffer, read
after one wait.
"""

from __future__ import annotations

from collections import OrderedDict

import wgpu

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.device import Device
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.named.binding_model import Bound, Limits, NamedCall, plan_bindings
from kem_port.gpu.pipelines import gpu_message
from kem_port.gpu.wgpu_private import ErrorCapture
from kem_port.gpu.wgsl.wgsl_reflect import KernelShape, reflect
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

PIPELINES = 64  # kernels kept compiled (a pipeline and its layouts: ~KBs of host memory each)
_TYPES = {"input": "read-only-storage", "output": "storage", "inout": "storage", "uniform": "uniform"}
_U = wgpu.BufferUsage


class NamedRuns:
    """Named-buffer calls on one executor's device."""

    def __init__(self, gpu: Device, stats: Stats) -> None:
        self.gpu, self.stats = gpu, stats
        self._device: wgpu.GPUDevice | None = None
        self._pipelines: OrderedDict[tuple, tuple] = OrderedDict()
        self._shapes: dict[str, KernelShape] = {}

    def run(self, source: KernelSource, call: NamedCall) -> dict[str, bytes]:
        """The call's returned buffers by WGSL name. Raises KemError."""
        device = self.gpu.require()
        if device is not self._device:  # a new device: the old one's pipelines go
            self._pipelines.clear()
            self._device = device
        shape = self._shape(source)
        entry = shape.entry_points.get(call.entry_point)
        if entry is None or entry.stage != "compute":
            raise KemError("bad_kernel", f"no @compute entry point {call.entry_point!r} (found {', '.join(shape.entry_points) or 'none'})")
        if call.workgroups is None:
            raise bad_args("a call by named buffers gives its dispatch: workgroups => {X, Y, Z}; "
                           "kem's default rules are for kem@1.0-shaped kernels only (docs/dispatch.md)")
        bound = plan_bindings(shape, call, Limits(self.gpu.binding_limit, self.gpu.uniform_limit))
        returned = sum(x.logical for x in bound if x.returned)  # outputs and in/out buffers
        if returned > self.gpu.config.max_output_bytes:
            raise too_large(f"{returned} bytes would come back; KEM_MAX_OUTPUT_BYTES={self.gpu.config.max_output_bytes}")
        groups = plan_dispatch(entry, 0, (), call.workgroups, self.gpu.dispatch_limits)
        pipeline, layouts = self._pipeline(device, source, call.entry_point, bound)
        return self._dispatch(device, pipeline, layouts, bound, groups)

    def _shape(self, source: KernelSource) -> KernelShape:
        shape = self._shapes.get(source.sha256)
        if shape is None:
            shape = self._shapes[source.sha256] = reflect(source.text)
        return shape

    def _pipeline(self, device: wgpu.GPUDevice, source: KernelSource, entry: str, bound: list[Bound]) -> tuple:
        key = (source.sha256, entry)
        found = self._pipelines.get(key)
        if found is not None:
            self._pipelines.move_to_end(key)
            self.stats.inc("pipeline_hits")
            return found
        errors = ErrorCapture()
        try:
            module = errors.call(lambda: device.create_shader_module(code=source.text, label=source.kernel_id))
        except wgpu.GPUError as exc:
            raise KemError("shader_error", gpu_message(exc)) from None
        try:
            layouts = errors.call(self._layouts, device, bound)
            pipeline = errors.call(lambda: device.create_compute_pipeline(
                layout=device.create_pipeline_layout(bind_group_layouts=list(layouts.values())),
                compute={"module": module, "entry_point": entry}))
        except wgpu.GPUError as exc:
            raise KemError("bad_kernel", gpu_message(exc)) from None
        self.stats.inc("compiles")
        self._pipelines[key] = found = (pipeline, layouts)
        while len(self._pipelines) > PIPELINES:
            self._pipelines.popitem(last=False)
        return found

    @staticmethod
    def _layouts(device: wgpu.GPUDevice, bound: list[Bound]) -> dict[int, wgpu.GPUBindGroupLayout]:
        """One layout per group 0..the highest used (an unused group gets an empty one, as WebGPU requires)."""
        top = max(x.binding.group for x in bound)
        return {
            group: device.create_bind_group_layout(entries=[
                {"binding": x.binding.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": _TYPES[x.role]}}
                for x in bound if x.binding.group == group
            ])
            for group in range(top + 1)
        }

    def _dispatch(self, device: wgpu.GPUDevice, pipeline, layouts: dict, bound: list[Bound], groups) -> dict[str, bytes]:
        errors = ErrorCapture()
        try:
            return errors.call(self._submit, device, pipeline, layouts, bound, groups)
        except wgpu.GPUError as exc:
            raise KemError("gpu_error", gpu_message(exc)) from None

    def _submit(self, device: wgpu.GPUDevice, pipeline, layouts: dict, bound: list[Bound], groups) -> dict[str, bytes]:
        buffers = [self._buffer(device, x) for x in bound]
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        for group, layout in layouts.items():
            entries = [{"binding": x.binding.binding, "resource": {"buffer": buf, "offset": 0, "size": x.size}}
                       for x, buf in zip(bound, buffers) if x.binding.group == group]
            compute.set_bind_group(group, device.create_bind_group(layout=layout, entries=entries))
        compute.dispatch_workgroups(*groups)
        compute.end()
        returned = [(x, buf) for x, buf in zip(bound, buffers) if x.returned]
        offsets, total = [], 0
        for x, _ in returned:
            offsets.append(total)
            total += x.size
        staging = device.create_buffer(size=max(total, 4), usage=_U.MAP_READ | _U.COPY_DST)
        for (x, buf), offset in zip(returned, offsets):
            encoder.copy_buffer_to_buffer(buf, 0, staging, offset, x.size)
        device.queue.submit([encoder.finish()])
        staging.map_sync(wgpu.MapMode.READ)
        try:
            view = staging.read_mapped()
            result = {x.binding.name: bytes(view[offset : offset + x.logical]) for (x, _), offset in zip(returned, offsets)}
        finally:
            staging.unmap()
        self.stats.bump((("named_calls", 1), ("bytes_out", sum(x.logical for x, _ in returned))))
        return result

    @staticmethod
    def _buffer(device: wgpu.GPUDevice, x: Bound) -> wgpu.GPUBuffer:
        usage = (_U.UNIFORM if x.role == "uniform" else _U.STORAGE | _U.COPY_SRC) | _U.COPY_DST
        buffer = device.create_buffer(size=x.size, usage=usage, label=f"kem-named-{x.binding.name}")
        if x.data:  # created zeroed (WebGPU); the caller's bytes over the start, the padding stays zero
            device.queue.write_buffer(buffer, 0, x.data + bytes(-len(x.data) % 4))
        return buffer
