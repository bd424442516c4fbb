"""The kernel contract in a session or chain: kem's bindings 0-2 as always
(gpu/contract.py), plus storage bindings from 3 up, each bound to the
session buffer named like its WGSL variable (or renamed per call).

Binding 3 is also where a plain call's kernel may declare the call table
(gpu/call_table.py, ``kem_calls``); a kernel that does is refused here.

``var<storage, read>`` is laid out read-only and ``var<storage, read_write>``
writable, so the WGSL's access mode is what the device enforces.
"""

from __future__ import annotations

from dataclasses import dataclass

import wgpu

from kem_port.errors import KemError
from kem_port.gpu import contract
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.wgsl.wgsl_reflect import Binding, EntryPoint, KernelShape

FIRST_NAMED = contract.PARAMS + 1
# A plain call reads a read-only binding 3 as the call table; in a session
# binding 3 names a buffer. The ABI's own name tells the table apart.
CALL_TABLE_NAME = "kem_calls"


@dataclass(frozen=True)
class NamedBinding:
    binding: int
    wgsl_name: str
    writable: bool


@dataclass(frozen=True)
class SessionLayout:
    base: KernelShape  # the shape with bindings 0-2 only
    entry: EntryPoint | None
    named: tuple[NamedBinding, ...]
    input_writable: bool


def is_named(b: Binding) -> bool:
    return b.group == contract.GROUP and b.binding >= FIRST_NAMED


def check_session_layout(shape: KernelShape, entry_point: str, params: bytes | None) -> SessionLayout:
    """Bindings 0-2 by kem's contract; every binding from 3 up a named
    storage buffer of group 0."""
    base = KernelShape(shape.entry_points, tuple(b for b in shape.bindings if not is_named(b)))
    probe = KernelCall("session", b"", 0, params, None, entry_point)
    entry = contract.check_layout(base, probe)
    named = []
    for b in sorted((b for b in shape.bindings if is_named(b)), key=lambda b: b.binding):
        if b.binding == contract.TABLE and b.name == CALL_TABLE_NAME:
            raise KemError("bad_kernel", f"{b.name} at @binding({b.binding}) is a call table (gpu/call_table.py): "
                           "such kernels run as plain calls, not in a session or chain")
        if b.address_space != "storage":
            raise KemError("bad_kernel", f"{b.name} at @binding({b.binding}): session bindings must be var<storage, read> or var<storage, read_write>")
        if not b.name:
            raise KemError("bad_kernel", f"@binding({b.binding}) has no variable name kem can read")
        named.append(NamedBinding(b.binding, b.name, b.access == "read_write"))
    inp = base.binding(contract.GROUP, contract.INPUT)
    return SessionLayout(base, entry, tuple(named), inp is not None and inp.access == "read_write")


def layout_entries(layout: SessionLayout, has_params: bool) -> list[dict]:
    entries = contract.layout_entries(layout.base, has_params)
    for n in layout.named:
        kind = "storage" if n.writable else "read-only-storage"
        entries.append({"binding": n.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}})
    return entries


def group_entries(
    inputs: tuple[wgpu.GPUBuffer, int, int],
    outputs: tuple[wgpu.GPUBuffer, int, int],
    params: tuple[wgpu.GPUBuffer, int, int] | None,
    named: list[tuple[int, wgpu.GPUBuffer, int, int]],
) -> list[dict]:
    """A step's bind group: kem's bindings, then (binding, buffer, offset, size) of each named one."""
    entries = contract.group_entries(inputs, outputs, params)
    entries += [{"binding": b, "resource": {"buffer": buf, "offset": offset, "size": size}} for b, buf, offset, size in named]
    return entries
