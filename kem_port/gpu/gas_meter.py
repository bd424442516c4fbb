"""The host's half of gas (docs/metering.md): each dispatch of a metered
pipeline (a kernel with a loop, gpu/wgsl/wgsl_gas.py) gets a per-invocation
cap and a meter, and its callers hear ``gas_exhausted`` when it ran out.

Where they live in a batch: the cap (16 bytes) in the batch's uniform
buffer after the params, the meter (16 bytes) in its output buffer after
the outputs. The output buffer is zeroed before the pass and copied to
staging after it, so the meter starts at zero and comes back with the
outputs: no buffer, upload or copy of its own. Both are bound at the gas
group (wgsl_gas.GROUP = 1; kem binds kernels at group 0 only). A named run
binds them at its kernel's own gas group (gpu/named/named_gas.py).

Gas of a dispatch = invocations launched (workgroups x workgroup size,
counted here) + loop iterations (the meter's 64-bit count). A call-table
dispatch shares one meter among its calls: the cap is the smallest of
theirs, and if it runs out they all hear it.
"""

from __future__ import annotations

from dataclasses import dataclass

import wgpu

from kem_port.errors import KemError
from kem_port.gpu.group import call_table
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint


@dataclass(slots=True)
class GasSlot:
    """One metered dispatch's cap and meter, and what they were made from."""

    limit: int  # the call's gas budget
    invocations: int  # launched by the dispatch
    cap: int  # loop iterations each invocation may count
    cap_offset: int = 0  # in the batch's uniform buffer
    meter_offset: int = 0  # in the batch's output buffer


def layout_entries() -> list[dict]:
    """The gas group's bind group layout: the cap, then the meter."""
    stage = wgpu.ShaderStage.COMPUTE
    return [
        {"binding": wgsl_gas.CAP_BINDING, "visibility": stage, "buffer": {"type": "uniform"}},
        {"binding": wgsl_gas.METER_BINDING, "visibility": stage, "buffer": {"type": "storage"}},
    ]


def invocations(entry: EntryPoint | None, groups: tuple[int, int, int]) -> int:
    """Invocations a dispatch launches. A workgroup size kem cannot read
    (literals, consts and overrides it reads; `select(1u, 64u, true)` it
    does not) is refused: counted as 1 it let a call pass its own gas limit
    by up to the workgroup size (1,000 held 57,664: red team of wave 3)."""
    if entry is not None and not entry.workgroup_size:
        raise KemError("bad_kernel", f"kem cannot read @workgroup_size of {entry.name}, and gas counts invocations by it: "
                       "write it with literals, consts or override constants")
    size = entry.workgroup_size if entry is not None else (1, 1, 1)
    return groups[0] * groups[1] * groups[2] * size[0] * size[1] * size[2]


def slot_for(limit: int, entry: EntryPoint | None, groups: tuple[int, int, int], turns: int) -> GasSlot:
    """The slot of one call's dispatch on a device whose ceiling is turns;
    gas_exhausted before launch when the limit does not cover launching
    (per_invocation_cap)."""
    launched = invocations(entry, groups)
    return GasSlot(limit, launched, per_invocation_cap(limit, launched, turns))


def launch_slot(call, pipeline, groups: tuple[int, int, int], default_limit: int, turns: int) -> GasSlot | None:
    """A call's slot when its pipeline is metered (the call's gas_limit, else
    the node's); a loop-free call's own limit is checked against what it
    launches (its whole gas): gas_exhausted before it runs when short."""
    if pipeline.gas_layout is None:
        if call.gas_limit is not None:
            per_invocation_cap(call.gas_limit, invocations(pipeline.entry, groups), turns)
        return None
    return slot_for(call.gas_limit or default_limit, pipeline.entry, groups, turns)


def table_slots(tables: list, max_groups: int) -> list[GasSlot]:
    """One slot for each metered call-table dispatch, shared by its calls
    (a metered group job was split into plain calls: executor.py, so only
    the plan's own TableGroups meet a metered pipeline)."""
    slots = []
    for table in tables:
        if table.items[0].gas is None:
            continue
        entry = table.pipeline.entry
        dims = table.items[0].groups if table.alone else call_table.workgroups(table.words, entry.workgroup_size[0], max_groups)
        table.gas = shared_slot([item.gas for item in table.items], invocations(entry, dims))
        for item in table.items:
            item.gas = table.gas
        slots.append(table.gas)
    return slots


def shared_slot(slots: list[GasSlot], launched: int) -> GasSlot:
    """One slot for a call-table dispatch: the strictest budget of its calls,
    spread over what the shared dispatch launches."""
    limit = min(slot.limit for slot in slots)
    cap = min(min(slot.cap for slot in slots), CAP_MAX if launched <= 0 else max(0, (limit - launched) // launched))
    return GasSlot(limit, launched, cap)


def lay_out(slots: list[GasSlot], out_total: int, u_total: int, storage_align: int, uniform_align: int) -> tuple[int, int]:
    """Give each slot its offsets after the outputs and params; the new totals."""
    for slot in slots:
        slot.meter_offset = out_total = _align(out_total, storage_align)
        out_total += wgsl_gas.METER_BYTES
        slot.cap_offset = u_total = _align(u_total, uniform_align)
        u_total += wgsl_gas.CAP_BYTES
    return out_total, u_total


def write_caps(slots: list[GasSlot], params: bytearray) -> None:
    for slot in slots:
        params[slot.cap_offset : slot.cap_offset + 4] = slot.cap.to_bytes(4, "little")


def bind(encoder, device: wgpu.GPUDevice, pipelines, layout, slot: GasSlot, u_buf, out_buf, serials: tuple[int, int]) -> None:
    """Set the gas group for the dispatch that follows (its bind group cached
    like the kernel's, by buffer serials and offsets)."""
    key = ("gas", serials[0], slot.cap_offset, serials[1], slot.meter_offset)
    group = pipelines.cached_bind_group(key)
    if group is None:
        group = device.create_bind_group(layout=layout, entries=[
            {"binding": wgsl_gas.CAP_BINDING, "resource": {"buffer": u_buf, "offset": slot.cap_offset, "size": wgsl_gas.CAP_BYTES}},
            {"binding": wgsl_gas.METER_BINDING, "resource": {"buffer": out_buf, "offset": slot.meter_offset, "size": wgsl_gas.METER_BYTES}},
        ])
        pipelines.keep_bind_group(key, group)
    encoder.set_bind_group(group, wgsl_gas.GROUP)


def read(view: memoryview, slot: GasSlot) -> tuple[int, bool]:
    """(gas, ran out) of a landed dispatch, from the mapped output range."""
    words = view[slot.meter_offset : slot.meter_offset + wgsl_gas.METER_BYTES].cast("I")
    return meter_gas(words, slot.invocations)


def used(view: memoryview, item) -> int:
    """A landed call's gas (a Prepared, gpu/plan.py): its meter's count when
    metered, else the invocations its own dispatch launches, counted here.
    A loop-free call in a shared call-table dispatch counts its own plan's
    dispatch, so its gas does not depend on who shared its batch."""
    if item.gas is None:
        return invocations(item.pipeline.entry, item.groups)
    return read(view, item.gas)[0]


def refused(view: memoryview, job, slot: GasSlot | None) -> bool:
    """Whether job's dispatch ran out of gas; if so its caller hears
    gas_exhausted (with the gas used and the limit) and no output."""
    if slot is None:
        return False
    try:
        check(view, slot)
    except KemError as exc:
        job.refuse(exc)
        return True
    return False


def check(view: memoryview, slot: GasSlot) -> int:
    """The gas a landed dispatch used; KemError gas_exhausted if it ran out."""
    gas, ran_out = read(view, slot)
    if ran_out:
        raise exhausted(gas, slot)
    return gas


def exhausted(gas: int, slot: GasSlot) -> KemError:
    """The refusal of a dispatch that ran out, the same on every road."""
    return KemError("gas_exhausted", f"gas used {gas} of limit {slot.limit} (an invocation passed its {slot.cap} loop iterations)")


CAP_MAX = 1 << 30  # kem_gas_u passes the cap by at most one tick per barrier-loop entry: 2^30 keeps it far from u32 wrap
# The most loop turns one invocation may count in one call, whatever its
# gas limit (KEM_GAS_TURNS, set when the device opens). Measured on the
# H100 (docs/results/issue27_h100_gas_bench.txt): runaways of five shapes at
# 65,000 turns an invocation were answered in 2.8-20 ms, while the 2^28 turns
# that 2^34 gave 64 invocations ran into the 60 s timeout. lavapipe ends an
# invocation's loops at 65,535 turns by itself, silently (a wrong answer
# reported as a success), so on a CPU adapter the ceiling stays under it
# and such a kernel is gas_exhausted instead. Each device keeps its own
# (Device.gas_turns): a module global set at open let the device opened last
# set it for all (red team: KEM_GAS_TURNS 1,000 held 60,000 turns).
TURNS_DEFAULT = 60_000
CPU_TURNS_MAX = 65_000


def turns_for(turns: int, cpu_adapter: bool) -> int:
    """The per-invocation ceiling of a device from its KEM_GAS_TURNS."""
    return max(1, min(turns, CAP_MAX, CPU_TURNS_MAX if cpu_adapter else CAP_MAX))


def per_invocation_cap(gas_limit: int, invocations: int, turns: int) -> int:
    """The cap each invocation's loop iterations get from a call's gas
    limit: what is left after launching, shared evenly, at most the
    device's turns ceiling (gas_exhausted before launch when the limit does
    not cover the invocations)."""
    if invocations <= 0:
        return turns
    if gas_limit < invocations:
        raise KemError("gas_exhausted", f"gas used 0 of limit {gas_limit}: launching {invocations} invocations needs {invocations}")
    return min((gas_limit - invocations) // invocations, turns)


def meter_gas(words: tuple[int, int, int, int] | list[int], invocations: int) -> tuple[int, bool]:
    """(gas, ran out) from the meter's four words."""
    return invocations + words[0] + (words[1] << 32), bool(words[2])


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a
