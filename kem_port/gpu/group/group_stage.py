"""A group job's part of a batch's stages (gpu/batch.py): a dispatch per
live slot, and the live slots' outputs gathered into one blob.

Per slot this is the whole of the GPU thread's Python: set_bind_group and
dispatch, in one loop with nothing looked up (Encoder.dispatch_each). The
checks, the pipeline and the workgroup count were found once for the group
(plan.BatchPreparer), the inputs packed with one numpy copy
(input_upload.pack_slots) and the outputs zeroed with the rest of the batch's
output range (exactly as for single calls). The slots' bind groups are
cached as one list per layout (Pipelines.cached_slot_list): under steady
traffic a group lands at the same offsets of the same pooled buffers, and
a key and a cache lookup per slot cost ~1 us of the ~2.8 us a slot's
encoding took at 64 slots on lavapipe (scripts/bench_group.py).

**Canaries** (defence in depth for the slot form, issue 24): each slot of
a plain group's output range is laid out as [the call's output | 4 canary
words | zeros | the slot form's spare element (its last 16 bytes at most)]
(plan.SLOT_ROOM keeps room for both), filled before the dispatch
(Stages._clear_outputs) and checked after the readback when the slot form
ran. Nothing a correct slot form does can reach them: its writes land in
the call's output elements or in the spare element. A broken canary means
it wrote outside a slot (a rewrite fooled, or a bug): the group fails with
`internal` (the caller did nothing wrong; a new reason would be one more
for every client to learn, and `internal` is what a kem bug answers), the
event is logged, and the kernel keeps one dispatch per call from then on.

Why 4 words, not the whole gap up to the spare: they share the cache line
of the output's tail, which the gather has just read, so the check costs
~2 us a 64-call group; every word of the gap cost ~12 us more on lavapipe
(cold lines the GPU's threads wrote), ~0.2 us a call where a call costs
~4.5. What this cannot see: a write past those 4 words that stops short
of the spare, or one that lands in another slot's output; and any read
outside a slot (reads leave no trace). It catches the common slip, a
write just past the call's output.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache

import numpy as np

from kem_port.errors import KemError
from kem_port.gpu import gas_meter
from kem_port.gpu.group import call_table
from kem_port.gpu.pipelines import NO_BINDING, Pipelines
from kem_port.gpu.wgpu_private import serial_of
from kem_port.gpu.plan import Prepared

log = logging.getLogger("kem_port.gpu.group_stage")

# Per process, so that kernel text cannot count on writing the value back.
CANARY = int.from_bytes(os.urandom(4), "little") | 1
CANARY_BYTES = 16  # 4 words right past each call's output
FAULT = "kem's one-dispatch form of this kernel wrote outside a call's slot: the group's results were discarded; a retry runs one dispatch per call"


def dispatch_slots(encoder, pipelines: Pipelines, device, item: Prepared, in_buf, out_buf, in_serial: int, out_serial: int, binding_limit: int) -> int:
    """Dispatch a group item's slots: all at once through the kernel's slot
    form where it has one (gpu/slot_dispatch.py), else each live slot with
    its own bind group. Returns the per-slot bind group cache hits."""
    job = item.job
    if pipelines.slots.dispatch(encoder, device, item, in_buf, out_buf, in_serial, out_serial, binding_limit):
        item.canary = canary_bytes(item)
        pipelines.stats.inc("slot_dispatches")
        pipelines.stats.inc("slot_calls", job.calls)
        return 0
    layout = (item.pipeline.serial, in_serial, item.in_offset, item.in_size, item.in_stride,
              out_serial, item.out_offset, item.out_size, item.out_stride, job.calls)
    groups = pipelines.cached_slot_list(layout)
    hits = job.calls
    if groups is None:
        groups, hits = _slot_groups(pipelines, device, item, in_buf, out_buf, in_serial, out_serial)
        pipelines.keep_slot_list(layout, groups)
    live = job.live_slots()
    if len(live) < job.calls:  # some expired while queued: skipped
        groups = [groups[slot] for slot in live.tolist()]
    encoder.dispatch_each(groups, *item.groups)
    return hits


def _slot_groups(pipelines: Pipelines, device, item: Prepared, in_buf, out_buf, in_serial: int, out_serial: int) -> tuple[list, int]:
    """Every slot's bind group (from the single calls' cache where it has them)."""
    pipeline, in_size, out_size = item.pipeline, item.in_size, item.out_size
    groups, hits = [], 0
    for slot in range(item.job.calls):
        in_offset = item.in_offset + slot * item.in_stride
        out_offset = item.out_offset + slot * item.out_stride
        key = (pipeline.serial, in_serial, in_offset, in_size, out_serial, out_offset, out_size, *NO_BINDING, *NO_BINDING)
        group = pipelines.cached_bind_group(key)
        if group is None:
            group = pipelines.new_bind_group(key, device, pipeline, (in_buf, in_offset, in_size), (out_buf, out_offset, out_size), None)
        else:
            hits += 1
        groups.append(group)
    return groups, hits


def gather(mapped: memoryview, item: Prepared) -> bytes:
    """The live slots' outputs back to back, copied out of the mapped staging."""
    job = item.job
    size = job.call.output_size
    slots = np.frombuffer(mapped, np.uint8, job.calls * item.out_stride, item.out_offset).reshape(-1, item.out_stride)
    live = job.live_slots()
    if len(live) == job.calls:
        return slots[:, :size].tobytes()  # one copy
    return slots[live, :size].tobytes()


def canary_bytes(item: Prepared) -> tuple[int, int]:
    """Where each slot's canary words lie, from the slot's start: right
    past the call's output (a whole number of words), before the spare."""
    return item.out_size, item.out_size + CANARY_BYTES


def canary_fill(item: Prepared) -> bytes:
    """A plain group's whole output range as uploaded: zeros, canaries between."""
    return _fill(item.job.calls, item.out_stride, *canary_bytes(item))


@lru_cache(maxsize=64)
def _fill(calls: int, out_stride: int, start: int, end: int) -> bytes:
    slots = np.zeros((calls, out_stride // 4), "<u4")
    slots[:, start // 4 : end // 4] = CANARY
    return slots.tobytes()


def slots_intact(mapped: memoryview, item: Prepared, pipelines: Pipelines) -> bool:
    """After the readback: False (the group failed, logged, the kernel's
    slot form retired) when the slot form broke a canary."""
    if item.canary is None:
        return True
    start, end = item.canary
    calls = item.job.calls
    # One strided view of every slot's canary words (one numpy call: 2.8 us
    # a 64-call group here, against 4.7 for a reshaped slice). Called after
    # the gather, which read the same cache lines.
    canaries = np.ndarray((calls, (end - start) // 4), "<u4", mapped, item.out_offset + start, (item.out_stride, 4))
    broken = canaries != CANARY
    if not broken.any():
        return True
    source = item.pipeline.source
    log.error(
        "%s: its slot form wrote outside a slot (canaries of %d of %d slots broken); the group's calls fail "
        "and the kernel runs one dispatch per call from now on", source.kernel_id if source else "?",
        int(broken.any(axis=1).sum()), calls,
    )
    pipelines.stats.inc("slot_faults")
    pipelines.slots.retire(item.pipeline)
    item.job.refuse(KemError("internal", FAULT))
    return False


def dispatch_table(encoder, device, pipelines: Pipelines, table, buffers: tuple, current, max_per_dimension: int):
    """One dispatch of a plan.TableGroup or group_table.SlotTable (one
    slot each for an unlisted kernel: the pipeline set once for a run);
    buffers: the batch's (input, output, table, uniform). A metered
    kernel's table binds its shared cap and meter (gpu/gas_meter.py)."""
    in_buf, out_buf, t_buf, u_buf = buffers
    if table.pipeline is not current:
        encoder.set_pipeline(table.pipeline.pipeline)
    group = pipelines.bind_group(
        device, table.pipeline, (in_buf, table.in_offset, table.in_bytes), (out_buf, table.out_offset, table.out_bytes),
        None, (t_buf, table.table_offset, len(table.rows)),
    )
    encoder.set_bind_group(group)
    if table.items[0].gas is not None:
        serials = (serial_of(u_buf), serial_of(out_buf))
        gas_meter.bind(encoder, device, pipelines, table.pipeline.gas_layout, table.items[0].gas, u_buf, out_buf, serials)
    if table.alone:
        encoder.dispatch(*table.items[0].groups)  # planned (and checked) like any call's
    else:
        width = table.pipeline.entry.workgroup_size[0]
        encoder.dispatch(*call_table.workgroups(table.words, width, max_per_dimension))
    return table.pipeline
