"""Compiled pipelines for kernels run in a session or chain.

They differ from a plain call's (gpu/pipelines.py) only in their layout:
every binding but a kem@1.0 kernel's 0-2 is named, in up to four bind
groups (gpu/session/session_contract.py). Cached per (kernel sha256, entry
point, with or without params, constants set) for one device; a new
device empties the cache.

Every pipeline is compiled from the kernel's gas form (gpu/wgsl/wgsl_gas.py,
``named_gas_form``: the meter in the lowest bind group the kernel leaves
free), the very text admission compiled (``source.metered`` not None) or
made here; a kernel with a loop then has ``gas_group`` set and each of its
dispatches binds a cap and meter there (gpu/session/chain_gas.py). Never an
uncounted loop: the gas form of a loop-free kernel is its own text.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, replace

import wgpu

from kem_port.errors import KemError
from kem_port.gpu import contract, gas_meter
from kem_port.gpu.kept import SHAPE_TEXT_BYTES, SHAPES, Kept
from kem_port.gpu.constants import pipeline_constants, set_key
from kem_port.gpu.workgroup_limits import check_workgroup_limits
from kem_port.gpu.session import session_contract
from kem_port.gpu.pipelines import compute_stage, gpu_message, named_shader
from kem_port.gpu.session.session_contract import SessionLayout
from kem_port.gpu.wgpu_private import ErrorCapture, serial_of
from kem_port.gpu.wgsl.wgsl_calls import used_names
from kem_port.gpu.wgsl.wgsl_gas import PREFIX, named_gas_form
from kem_port.gpu.wgsl.wgsl_reflect import KernelShape, reflect
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

CACHE_SIZE = 128
BIND_GROUP_CACHE_SIZE = 512


@dataclass(frozen=True)
class SessionPipeline:
    pipeline: wgpu.GPUComputePipeline
    layouts: dict[int, wgpu.GPUBindGroupLayout]  # by group, 0 to the highest used
    shape: SessionLayout
    serial: int  # never reused: keys the bind group cache
    gas_group: int | None = None  # where its cap and meter bind; None: no loop, no meter


class SessionPipelines:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._device: wgpu.GPUDevice | None = None
        self._cache: OrderedDict[tuple, SessionPipeline] = OrderedDict()
        self._shapes: Kept[KernelShape] = Kept(SHAPES, SHAPE_TEXT_BYTES)
        self._bind_groups: OrderedDict[tuple, wgpu.GPUBindGroup] = OrderedDict()
        self._serial = 0

    def _shape(self, source: KernelSource, text: str | None = None) -> KernelShape:
        """The kernel's own shape, by its text (`text`: its gas form, when the caller has made it)."""
        return self._shapes.get(source.sha256, lambda: own_shape(text if text is not None else gas_text(source)[0]), len(source.text))

    def has(self, source: KernelSource, entry_point: str, params: bytes | None, constants: tuple | None = None) -> bool:
        return _key(source, entry_point, params, constants) in self._cache

    def get(self, device: wgpu.GPUDevice, source: KernelSource, entry_point: str, params: bytes | None,
            constants: tuple | None = None) -> SessionPipeline:
        if device is not self._device:
            self._cache.clear()
            self._bind_groups.clear()
            self._device = device
        key = _key(source, entry_point, params, constants)
        found = self._cache.get(key)
        if found is not None:
            if params is not None and found.shape.positional:
                contract.check_params_size(self._shape(source), params)
            self._cache.move_to_end(key)
            return found
        text, gas_group = gas_text(source)
        shape = self._shape(source, text)
        layout = session_contract.check_session_layout(shape, entry_point, params, constants, used_names(text, entry_point))
        check_workgroup_limits(layout.entry, device.limits, text, self._shape(source), constants)  # once per pipeline
        if gas_group is not None:
            session_contract.check_gas_room(layout, params is not None)
        started = time.perf_counter()
        self._serial += 1
        compiled = _compile(device, source.kernel_id, text, entry_point, layout, params is not None, self._serial,
                            pipeline_constants(shape, constants), gas_group)
        self.stats.inc("compiles")
        self.stats.add_time("compile", time.perf_counter() - started)
        self._cache[key] = compiled
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def bind_group(self, device: wgpu.GPUDevice, pipeline: SessionPipeline, entries: list[dict], group: int = 0) -> wgpu.GPUBindGroup:
        """A bind group, cached by pipeline, group and each entry's buffer
        serial, offset and size: a chain run again on pooled buffers creates
        none (a bind group is one more native call per step, ~20 us here)."""
        key = (pipeline.serial, group) + tuple(
            (e["binding"], serial_of(e["resource"]["buffer"]), e["resource"]["offset"], e["resource"]["size"]) for e in entries
        )
        found = self._bind_groups.get(key)
        if found is not None:
            self._bind_groups.move_to_end(key)
            return found
        made = self._bind_groups[key] = device.create_bind_group(layout=pipeline.layouts[group], entries=entries)
        while len(self._bind_groups) > BIND_GROUP_CACHE_SIZE:
            self._bind_groups.popitem(last=False)
        return made


def gas_text(source: KernelSource) -> tuple[str, int | None]:
    """(text to compile, its gas group or None): the gas form admission
    made (source.metered set), else made here from the kernel's own text."""
    if source.metered is None:
        form = named_gas_form(source.text)
        return form.text, form.group if form.metered else None
    if not source.metered:
        return source.text, None
    return source.text, next(b.group for b in reflect(source.text).bindings if b.name.startswith(PREFIX))


def own_shape(text: str) -> KernelShape:
    """reflect() of a text without the gas group's bindings (kem's): the kernel's own layout."""
    shape = reflect(text)
    return replace(shape, bindings=tuple(b for b in shape.bindings if not b.name.startswith(PREFIX)))


def _key(source: KernelSource, entry_point: str, params: bytes | None, constants: tuple | None) -> tuple:
    """Each constants set is its own pipeline (gpu/constants.set_key: -0.0 is not 0.0)."""
    return source.sha256, entry_point, params is not None, set_key(constants) if constants else None


def _compile(device: wgpu.GPUDevice, kernel_id: str, text: str, entry: str, layout: SessionLayout, has_params: bool,
             serial: int, constants: dict[str, float], gas_group: int | None) -> SessionPipeline:
    """Shader module, one layout per bind group (the gas group's: cap and
    meter), the pipeline; naga's words as shader_error (naming the kernel) or bad_kernel."""
    errors = ErrorCapture()
    try:
        module = errors.call(lambda: device.create_shader_module(code=text, label=kernel_id))
    except wgpu.GPUError as exc:
        raise KemError("shader_error", named_shader(gpu_message(exc), kernel_id)) from None
    entries = session_contract.layout_entries(layout, has_params)
    if gas_group is not None:  # the lowest group the kernel declares none in: empty in its own layout
        entries = {g: entries.get(g, []) for g in range(max(max(entries), gas_group) + 1)}
        entries[gas_group] = gas_meter.layout_entries()
    try:
        layouts = {g: errors.call(lambda e=e: device.create_bind_group_layout(entries=e)) for g, e in entries.items()}
        pipeline = errors.call(lambda: device.create_compute_pipeline(
            layout=device.create_pipeline_layout(bind_group_layouts=list(layouts.values())),
            compute=compute_stage(module, entry, constants), label=kernel_id))
    except wgpu.GPUError as exc:
        raise KemError("bad_kernel", gpu_message(exc)) from None
    return SessionPipeline(pipeline, layouts, layout, serial, gas_group)
