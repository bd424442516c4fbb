"""Compiled pipelines and bind groups, cached for one device.

A pipeline is compiled once per (kernel sha256, entry point, with or
without params, debug, constants set) and kept in an LRU of PIPELINE_CACHE_SIZE; bind groups are
cached by buffer serial, offsets and sizes, so steady traffic (the same
pooled buffers, the same shapes) creates none. Both caches are emptied
when the device is replaced.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

import wgpu

from kem_port.errors import KemError
from kem_port.gpu import contract
from kem_port.gpu.kept import SHAPE_TEXT_BYTES, SHAPES, Kept
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.constants import pipeline_constants, set_key
from kem_port.gpu.workgroup_limits import check_workgroup_limits
from kem_port.gpu.group.slot_dispatch import SlotForms
from kem_port.gpu import gas_meter
from kem_port.gpu.wgpu_private import serial_of
from kem_port.gpu.wgsl.wgsl_gas import GROUP, PREFIX, gas_form, metered
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint, KernelShape, reflect
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

log = logging.getLogger("kem_port.gpu.pipelines")

PIPELINE_CACHE_SIZE = 256
BIND_GROUP_CACHE_SIZE = 1024
# Slot lists (a group job's N bind groups, gpu/group_stage.py) kept: each
# holds up to 256 groups, so this bounds them to 16k.
SLOT_LIST_CACHE_SIZE = 64


@dataclass(frozen=True)
class Pipeline:
    pipeline: wgpu.GPUComputePipeline
    layout: wgpu.GPUBindGroupLayout
    entry: EntryPoint | None
    serial: int  # never reused, unlike id(): keys the bind group cache
    tabled: bool = False  # declares the call table: its calls share dispatches
    debugged: bool = False  # binds the debug channel (a debug call's kernel that declares it)
    source: KernelSource | None = None  # what was compiled: a group's slot form is built from it (gpu/slot_dispatch.py)
    gas_layout: wgpu.GPUBindGroupLayout | None = None  # metered (a kernel with a loop): the gas group's layout (gpu/gas_meter.py)


def gpu_message(exc: BaseException) -> str:
    """A wgpu/naga error as a caller reads it (bounded)."""
    text = str(exc).strip()
    return text[:4000] if text else type(exc).__name__


def named_shader(message: str, kernel_id: str) -> str:
    """naga's message with the kernel's id where it names the shader: wgpu-native
    22 drops the module's label, so compile errors said ``Shader '' parsing
    error`` and ``┌─ wgsl:4:26`` (issue 26), not which kernel."""
    return message.replace("Shader ''", f"Shader '{kernel_id}'").replace("┌─ wgsl:", f"┌─ {kernel_id}:").replace("┌─ :", f"┌─ {kernel_id}:")


def _key(source: KernelSource, call: KernelCall) -> tuple:
    # debug: a debug call's pipeline binds the debug channel (contract.DEBUG);
    # constants: each set is its own pipeline (None, the kernel's defaults)
    return (source.sha256, call.entry_point, call.params is not None, call.debug, call.constants and set_key(call.constants))


class Pipelines:
    def __init__(self, stats: Stats, slot_dispatch: bool = True) -> None:
        self.stats = stats
        self._cache: OrderedDict[tuple, Pipeline] = OrderedDict()
        self._shapes: Kept[KernelShape] = Kept(SHAPES, SHAPE_TEXT_BYTES)
        self._bind_groups: OrderedDict[tuple, wgpu.GPUBindGroup] = OrderedDict()
        self._slot_lists: OrderedDict[tuple, list[wgpu.GPUBindGroup]] = OrderedDict()
        self.slots = SlotForms(slot_dispatch)  # group jobs of plain kernels as one dispatch
        self._serial = 0

    def clear(self) -> None:
        """Forget what belonged to a device that is gone."""
        self._cache.clear()
        self._bind_groups.clear()
        self._slot_lists.clear()
        self.slots.clear()

    def __len__(self) -> int:
        return len(self._cache)

    def has(self, source: KernelSource, call: KernelCall) -> bool:
        return _key(source, call) in self._cache

    def _shape(self, source: KernelSource) -> KernelShape:
        return self._shapes.get(source.sha256, lambda: kernel_shape(source.text), len(source.text))

    def get(self, device: wgpu.GPUDevice, source: KernelSource, call: KernelCall) -> Pipeline:
        key = _key(source, call)
        found = self._cache.get(key)
        if found is not None:
            if call.params is not None:
                contract.check_params_size(self._shape(source), call.params)
            self._cache.move_to_end(key)
            self.stats.inc("pipeline_hits")
            return found
        self.stats.inc("pipeline_misses")
        shape = self._shape(source)
        entry = contract.check_layout(shape, call)
        check_workgroup_limits(entry, device.limits, source.text, shape, call.constants)  # an override may size it past them
        started = time.perf_counter()
        constants = pipeline_constants(shape, call.constants)
        pipeline, layout, gas_layout = _compile(device, source, call.entry_point, shape, call.params is not None, constants)
        elapsed = time.perf_counter() - started
        self.stats.inc("compiles")
        self.stats.add_time("compile", elapsed)
        log.info("compiled %s:%s in %.1f ms", source.kernel_id, call.entry_point, elapsed * 1e3)
        self._serial += 1
        tabled = contract.uses_call_table(shape)
        debugged = contract.declares_debug(shape)
        result = self._cache[key] = Pipeline(pipeline, layout, entry, self._serial, tabled, debugged, source, gas_layout)
        while len(self._cache) > PIPELINE_CACHE_SIZE:
            self._cache.popitem(last=False)
        return result

    def bind_group(self, device, pipeline: Pipeline, inputs: tuple, outputs: tuple, params: tuple | None, table: tuple | None = None):
        """A bind group for (buffer, offset, size) of input, output, params and call table."""
        key = (pipeline.serial,) + _bound_key(inputs) + _bound_key(outputs) + (_bound_key(params) if params else NO_BINDING)
        key += _bound_key(table) if table else NO_BINDING
        group = self.cached_bind_group(key)
        if group is not None:
            self.stats.inc("bind_group_hits")
            return group
        return self.new_bind_group(key, device, pipeline, inputs, outputs, params, table)

    def cached_bind_group(self, key: tuple):
        """The cached group for `key` (bind_group's form), or None; the
        caller counts the hit (a batch counts its hits once)."""
        group = self._bind_groups.get(key)
        if group is not None:
            self._bind_groups.move_to_end(key)
        return group

    def cached_slot_list(self, key: tuple) -> list | None:
        """The bind groups of a group job's slots laid out as `key` says, or None."""
        found = self._slot_lists.get(key)
        if found is not None:
            self._slot_lists.move_to_end(key)
        return found

    def keep_slot_list(self, key: tuple, groups: list) -> None:
        self._slot_lists[key] = groups
        while len(self._slot_lists) > SLOT_LIST_CACHE_SIZE:
            self._slot_lists.popitem(last=False)

    def keep_bind_group(self, key: tuple, group) -> None:
        """Cache a group made elsewhere (the gas group, gpu/gas_meter.py)."""
        self._bind_groups[key] = group
        while len(self._bind_groups) > BIND_GROUP_CACHE_SIZE:
            self._bind_groups.popitem(last=False)

    def new_bind_group(self, key: tuple, device, pipeline: Pipeline, inputs: tuple, outputs: tuple, params: tuple | None, table: tuple | None = None):
        """Create the group for `key` and cache it (evicting the oldest)."""
        group = device.create_bind_group(layout=pipeline.layout, entries=contract.group_entries(inputs, outputs, params, table))
        self.keep_bind_group(key, group)
        return group


NO_BINDING = (0, 0, 0)  # a binding a group does not have, in a bind group key


def _bound_key(bound: tuple) -> tuple[int, int, int]:
    buf, offset, size = bound
    return (serial_of(buf), offset, size)


def _compile(device: wgpu.GPUDevice, source: KernelSource, entry: str, shape: KernelShape, has_params: bool,
             constants: dict[str, float]):
    return compile_with_layout(device, source, entry, contract.layout_entries(shape, has_params), constants)


def gas_text(source: KernelSource) -> tuple[str, bool]:
    """(text to compile, metered): the kernel's gas form, made here unless
    admission already made it (source.metered not None). Every loop a
    pipeline runs is counted (gpu/wgsl/wgsl_gas.py)."""
    if source.metered is not None:
        return source.text, source.metered
    form = gas_form(source.text)
    return form.text, form.metered


def kernel_shape(text: str) -> KernelShape:
    """reflect() of a kernel's text, without the gas group's bindings
    (kem's, in a gas form admission made: the contract sees the kernel's own)."""
    shape = reflect(text)
    if not metered(shape):
        return shape
    return replace(shape, bindings=tuple(b for b in shape.bindings if not (b.group == GROUP and b.name.startswith(PREFIX))))


def compute_stage(module, entry: str, constants: dict[str, float] | None) -> dict:
    """create_compute_pipeline's compute stage; constants only when given
    (the admission worker builds the same, admission/worker.py)."""
    stage = {"module": module, "entry_point": entry}
    if constants:
        stage["constants"] = constants
    return stage


def compile_with_layout(device: wgpu.GPUDevice, source: KernelSource, entry: str, entries: list[dict],
                        constants: dict[str, float] | None = None):
    """Shader module (of the kernel's gas form), bind group layouts from
    `entries` (and the gas group's, when metered) and pipeline, with naga's
    message as `shader_error` or `bad_kernel`."""
    text, metered = gas_text(source)
    try:
        module = device.create_shader_module(code=text, label=source.kernel_id)
    except wgpu.GPUError as exc:
        raise KemError("shader_error", named_shader(gpu_message(exc), source.kernel_id)) from None
    try:
        layout = device.create_bind_group_layout(entries=entries)
        gas_layout = device.create_bind_group_layout(entries=gas_meter.layout_entries()) if metered else None
        layouts = [layout, gas_layout] if metered else [layout]
        pipeline_layout = device.create_pipeline_layout(bind_group_layouts=layouts)
        pipeline = device.create_compute_pipeline(layout=pipeline_layout, compute=compute_stage(module, entry, constants))
    except wgpu.GPUError as exc:
        raise KemError("bad_kernel", gpu_message(exc)) from None
    return pipeline, layout, gas_layout
