"""A group job of a plain kernel as ONE dispatch (gpu/slot_kernel.py).

For each plain pipeline the first group job builds its slot form once: the
rewritten WGSL compiled with bindings 0 and 1 as the kernel declares them
and the slot uniform at binding 2. A kernel the rewrite refuses, or whose
slot form does not compile, is remembered as having none and keeps one
dispatch per slot (gpu/group_stage.py), as do slot layouts the form cannot
take (slot_kernel.slot_uniform) and groups over the binding limit.

The slot uniforms (16 bytes: lengths and strides) and the bind groups over
a group's whole slot ranges are cached by layout, as the per-slot bind
groups are: under steady traffic a group lands at the same offsets of the
same pooled buffers and creates nothing. Everything here belongs to one
device: Pipelines.clear empties it with the rest.
"""

from __future__ import annotations

import logging
import struct
from collections import OrderedDict
from dataclasses import dataclass

import wgpu

from kem_port.gpu import contract
from kem_port.gpu.group.slot_kernel import SLOT_BINDING, Refused, SlotKernel, rewrite, slot_uniform
from kem_port.gpu.wgsl.wgsl_reflect import reflect

log = logging.getLogger("kem_port.gpu.slot_dispatch")

CACHE_SIZE = 256  # slot forms (as pipelines.PIPELINE_CACHE_SIZE), uniforms and whole-group bind groups, each


@dataclass(frozen=True)
class SlotForm:
    pipeline: wgpu.GPUComputePipeline
    layout: wgpu.GPUBindGroupLayout
    kernel: SlotKernel


class SlotForms:
    def __init__(self, enabled: bool = True) -> None:
        # By Pipeline.serial, bounded like the pipeline cache it shadows: a
        # pipeline evicted there would otherwise keep its slot form here.
        self._forms: OrderedDict[int, SlotForm | None] = OrderedDict()
        self._uniforms: OrderedDict[tuple, wgpu.GPUBuffer] = OrderedDict()
        self._groups: OrderedDict[tuple, wgpu.GPUBindGroup] = OrderedDict()
        # (source sha256, entry point) of kernels whose slot form broke a
        # canary (group_stage.slots_intact): never again, whatever the caches
        # evict or a device rebuild clears. Grows by one per such kernel only.
        self._retired: set[tuple[str, str]] = set()
        self.enabled = enabled  # KEM_SLOT_DISPATCH=off: one dispatch per slot, as before

    def clear(self) -> None:
        self._forms.clear()
        self._uniforms.clear()
        self._groups.clear()

    def form(self, device: wgpu.GPUDevice, pipeline) -> SlotForm | None:
        """The slot form of a plain Pipeline (built on first use), or None."""
        serial = pipeline.serial
        if serial in self._forms:
            self._forms.move_to_end(serial)
            return self._forms[serial]
        form = None
        if pipeline.source is not None and pipeline.entry is not None and not pipeline.tabled and not pipeline.debugged:
            if (pipeline.source.sha256, pipeline.entry.name) not in self._retired:
                form = _build(device, pipeline)
        _keep(self._forms, serial, form)
        return form

    def retire(self, pipeline) -> None:
        """The kernel's slot form wrote outside a slot: one dispatch per call from now on."""
        self._retired.add((pipeline.source.sha256, pipeline.entry.name))
        _keep(self._forms, pipeline.serial, None)

    def dispatch(self, encoder, device, item, in_buf, out_buf, in_serial: int, out_serial: int, binding_limit: int) -> bool:
        """Dispatch every slot of a group item at once; False (nothing
        encoded) when this group cannot go as one dispatch."""
        if not self.enabled:
            return False
        x, y, z = item.groups
        calls = item.job.calls
        in_range, out_range = calls * item.in_stride, calls * item.out_stride
        if z != 1 or max(in_range, out_range) > binding_limit:
            return False
        form = self.form(device, item.pipeline)
        if form is None:
            return False
        words = slot_uniform(item.in_size, item.in_stride, item.out_size, item.out_stride, form.kernel)
        if words is None:
            return False
        key = (item.pipeline.serial, in_serial, item.in_offset, in_range, out_serial, item.out_offset, out_range, words)
        group = self._groups.get(key)
        if group is None:
            group = self._group(device, form, key, words, (in_buf, item.in_offset, in_range), (out_buf, item.out_offset, out_range))
        else:
            self._groups.move_to_end(key)
        encoder.set_pipeline(form.pipeline)
        encoder.set_bind_group(group)
        encoder.dispatch(x, y, calls)  # slots past their deadline run too; only live ones are answered
        return True

    def _group(self, device, form: SlotForm, key: tuple, words: tuple, inputs: tuple, outputs: tuple) -> wgpu.GPUBindGroup:
        uniform = self._uniforms.get(words)
        if uniform is None:
            uniform = device.create_buffer_with_data(data=struct.pack("<4I", *words), usage=wgpu.BufferUsage.UNIFORM)
            _keep(self._uniforms, words, uniform)
        entries = contract.group_entries(inputs, outputs, None) + [
            {"binding": SLOT_BINDING, "resource": {"buffer": uniform, "offset": 0, "size": 16}}
        ]
        group = device.create_bind_group(layout=form.layout, entries=entries)
        _keep(self._groups, key, group)
        return group


def _keep(cache: OrderedDict, key, value) -> None:
    cache[key] = value
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)


def _build(device: wgpu.GPUDevice, pipeline) -> SlotForm | None:
    source, entry = pipeline.source, pipeline.entry.name
    try:
        kernel = rewrite(source.text, entry)
    except Refused as why:
        log.debug("%s:%s keeps one dispatch per slot: %s", source.kernel_id, entry, why)
        return None
    entries = contract.layout_entries(reflect(source.text), False) + [
        {"binding": SLOT_BINDING, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "uniform"}}
    ]
    try:
        module = device.create_shader_module(code=kernel.source, label=f"{source.kernel_id} (slots)")
        layout = device.create_bind_group_layout(entries=entries)
        compiled = device.create_compute_pipeline(
            layout=device.create_pipeline_layout(bind_group_layouts=[layout]), compute={"module": module, "entry_point": entry}
        )
    except wgpu.GPUError as exc:
        log.warning("%s:%s: its slot form did not compile; one dispatch per slot (%s)", source.kernel_id, entry, str(exc)[:300])
        return None
    log.info("%s:%s runs a group as one dispatch", source.kernel_id, entry)
    return SlotForm(compiled, layout, kernel)
