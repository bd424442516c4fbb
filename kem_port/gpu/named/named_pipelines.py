"""Named-buffer calls' pipelines: each kernel's gas form compiled once per
(kernel sha256, entry point, constants set) with an explicit layout read
off its declarations -- one bind group layout per group it uses, each
binding typed by its role (read-only storage, storage, uniform) -- so the
device enforces the WGSL's access modes. Kept in a small LRU.
"""

from __future__ import annotations

from collections import OrderedDict

import wgpu

from kem_port.errors import KemError
from kem_port.gpu import gas_meter
from kem_port.gpu.named import named_gas
from kem_port.gpu.named.binding_model import Bound, Limits
from kem_port.gpu.pipelines import compute_stage, gpu_message, named_shader
from kem_port.gpu.wgpu_private import ErrorCapture
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

PIPELINES = 64  # kernels kept compiled (a pipeline and its layouts: ~KBs of host memory each)
_TYPES = {"input": "read-only-storage", "output": "storage", "inout": "storage", "uniform": "uniform"}


class NamedPipelines:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._pipelines: OrderedDict[tuple, tuple] = OrderedDict()

    def clear(self) -> None:
        self._pipelines.clear()

    def get(self, device: wgpu.GPUDevice, source: KernelSource, entry: str, set_key: tuple | None, bound: list[Bound],
            constants: dict[str, float], limits: Limits) -> tuple:
        """(pipeline, layouts, the gas meter's group or None) of the kernel's gas form, compiled once per key."""
        key = (source.sha256, entry, set_key)  # each constants set is its own pipeline
        found = self._pipelines.get(key)
        if found is not None:
            self._pipelines.move_to_end(key)
            self.stats.inc("pipeline_hits")
            return found
        text, gas_group = named_gas.gas_text(source)  # every loop counted (gpu/wgsl/wgsl_gas.py)
        if gas_group is not None:
            named_gas.check_room(bound, limits)
        errors = ErrorCapture()
        try:
            module = errors.call(lambda: device.create_shader_module(code=text, label=source.kernel_id))
        except wgpu.GPUError as exc:
            raise KemError("shader_error", named_shader(gpu_message(exc), source.kernel_id)) from None
        try:
            layouts = errors.call(_layouts, device, bound, gas_group)
            pipeline = errors.call(lambda: device.create_compute_pipeline(
                layout=device.create_pipeline_layout(bind_group_layouts=list(layouts.values())),
                compute=compute_stage(module, entry, constants)))
        except wgpu.GPUError as exc:
            raise KemError("bad_kernel", gpu_message(exc)) from None
        self.stats.inc("compiles")
        self._pipelines[key] = found = (pipeline, layouts, gas_group)
        while len(self._pipelines) > PIPELINES:
            self._pipelines.popitem(last=False)
        return found


def _layouts(device: wgpu.GPUDevice, bound: list[Bound], gas_group: int | None) -> dict[int, wgpu.GPUBindGroupLayout]:
    """One layout per group 0..the highest used, the gas group's holding
    the cap and meter (an unused group gets an empty one, as WebGPU requires)."""
    top = max([x.binding.group for x in bound] + ([gas_group] if gas_group is not None else []))
    return {
        group: device.create_bind_group_layout(entries=gas_meter.layout_entries() if group == gas_group else [
            {"binding": x.binding.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": _TYPES[x.role]}}
            for x in bound if x.binding.group == group
        ])
        for group in range(top + 1)
    }
