"""Which binding of a kernel a session or chain step binds to what.

Two shapes, told apart by the kernel's declarations:

* **kem@1.0-shaped** (``@group(0) @binding(0)`` a storage buffer,
  ``@binding(1)`` a ``read_write`` one, ``@binding(2)`` absent or a
  uniform): bindings 0-2 keep kem's contract byte for byte (the step's
  input, output and params: gpu/contract.py) and the default dispatch
  rules apply; every other binding the entry point uses is **named**.
* **any other kernel**: every binding the entry point uses is named, and
  its dispatch must be given (``grid`` or ``workgroups``).

A named binding takes its role from its declaration (gpu/named/
binding_model.role_of): ``var<storage, read>`` reads a buffer,
``var<storage, read_write>`` writes one (in place), ``var<uniform>`` takes
bytes the step gives. Which buffer is chain_bind.py's business.

Binding 3 is also where a plain call's kernel may declare the call table
(gpu/call_table.py, ``kem_calls``); a kernel that does is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass

import wgpu

from kem_port.errors import KemError
from kem_port.gpu import contract
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.constants import resolve_entry
from kem_port.gpu.named.binding_model import MAX_GROUPS, Bound, Limits, check_counts, role_of
from kem_port.gpu.named.named_gas import check_room
from kem_port.gpu.wgsl.wgsl_reflect import Binding, EntryPoint, KernelShape

# A plain call reads a read-only binding 3 as the call table; in a session
# binding 3 names a buffer. The ABI's own name tells the table apart.
CALL_TABLE_NAME = "kem_calls"
_TYPES = {"input": "read-only-storage", "output": "storage", "uniform": "uniform"}


@dataclass(frozen=True)
class NamedBinding:
    group: int
    binding: int
    wgsl_name: str
    role: str  # "input", "output" (read_write: written in place) or "uniform"
    declared: Binding

    @property
    def writable(self) -> bool:
        return self.role == "output"


@dataclass(frozen=True)
class SessionLayout:
    base: KernelShape | None  # kem@1.0-shaped: the shape with bindings 0-2 only; else None
    entry: EntryPoint | None  # with an override-sized workgroup resolved
    named: tuple[NamedBinding, ...]
    input_writable: bool

    @property
    def positional(self) -> bool:
        return self.base is not None


def is_positional(shape: KernelShape) -> bool:
    """kem@1.0's shape: a storage input at 0, a read_write output at 1, params (if any) a uniform at 2."""
    inp, out = shape.binding(contract.GROUP, contract.INPUT), shape.binding(contract.GROUP, contract.OUTPUT)
    params = shape.binding(contract.GROUP, contract.PARAMS)
    return (inp is not None and inp.address_space == "storage" and out is not None and out.address_space == "storage"
            and out.access == "read_write" and (params is None or params.address_space == "uniform"))


def _is_base(b: Binding) -> bool:
    return b.group == contract.GROUP and b.binding <= contract.PARAMS


def check_session_layout(shape: KernelShape, entry_point: str, params: bytes | None,
                         constants: tuple | None = None, used: set[str] | None = None) -> SessionLayout:
    """The step's layout: bindings 0-2 by kem's contract when the kernel is
    kem@1.0-shaped, every other binding the entry point uses (``used``:
    gpu/wgsl/wgsl_calls.used_names; None: every one declared) named."""
    positional = is_positional(shape)
    if positional:
        base = KernelShape(shape.entry_points, tuple(b for b in shape.bindings if _is_base(b)), shape.overrides)
        entry = contract.check_layout(base, KernelCall("session", b"", 0, params, None, entry_point, constants=constants))
    else:
        base, entry = None, _entry(shape, entry_point, constants)
    rest = [b for b in shape.bindings if not (positional and _is_base(b)) and (used is None or b.name in used)]
    named = tuple(_named(b) for b in sorted(rest, key=lambda b: (b.group, b.binding)))
    for a, b in zip(named, named[1:]):
        if (a.group, a.binding) == (b.group, b.binding):
            raise KemError("bad_kernel", f"{a.wgsl_name!r} and {b.wgsl_name!r} are both at @group({a.group}) @binding({a.binding})")
    if not positional and not any(n.writable for n in named):
        raise KemError("bad_kernel", "the kernel writes no buffer (no var<storage, read_write>): the step would do nothing")
    _check_counts(base, named, params is not None)
    inp = base.binding(contract.GROUP, contract.INPUT) if base is not None else None
    return SessionLayout(base, entry, named, inp is not None and inp.access == "read_write")


def _check_counts(base: KernelShape | None, named: tuple[NamedBinding, ...], has_params: bool) -> None:
    """WebGPU's buffers a compute stage may bind (8 storage, 12 uniform by
    default), by the layout alone: checked once per pipeline, not per step."""
    check_counts(_bound(base, named, has_params), Limits(0, 0))


def check_gas_room(layout: SessionLayout, has_params: bool) -> None:
    """A looping kernel's stage also binds kem's gas cap and meter (one
    uniform, one storage buffer): refused with the reason when that passes
    WebGPU's per-stage limits (gpu/named/named_gas.check_room)."""
    check_room(_bound(layout.base, layout.named, has_params), Limits(0, 0))


def _bound(base: KernelShape | None, named: tuple[NamedBinding, ...], has_params: bool) -> list[Bound]:
    roles = [n.role for n in named] + (["input", "output"] + (["uniform"] if has_params else []) if base is not None else [])
    return [Bound(None, role, None, 0, 0) for role in roles]  # type: ignore[arg-type]


def _entry(shape: KernelShape, entry_point: str, constants: tuple | None) -> EntryPoint | None:
    entry = shape.entry_points.get(entry_point)
    if entry is None or entry.stage not in (None, "compute"):
        raise KemError("bad_kernel", f"no @compute entry point {entry_point!r} (found {shape.compute_entries()})")
    return resolve_entry(entry, shape, constants)


def _named(b: Binding) -> NamedBinding:
    if b.group >= MAX_GROUPS:
        raise KemError("bad_kernel", f"{b.name} at @group({b.group}): WebGPU has bind groups 0-{MAX_GROUPS - 1}")
    if b.group == contract.GROUP and b.binding == contract.TABLE and b.name == CALL_TABLE_NAME:
        raise KemError("bad_kernel", f"{b.name} at @binding({b.binding}) is a call table (gpu/call_table.py): "
                       "such kernels run as plain calls, not in a session or chain")
    if not b.name:
        raise KemError("bad_kernel", f"@group({b.group}) @binding({b.binding}) has no variable name kem can read")
    return NamedBinding(b.group, b.binding, b.name, role_of(b), b)


def layout_entries(layout: SessionLayout, has_params: bool) -> dict[int, list[dict]]:
    """Each bind group's layout entries, group 0 to the highest used (an
    unused group gets an empty layout, as WebGPU requires)."""
    groups: dict[int, list[dict]] = {0: contract.layout_entries(layout.base, has_params) if layout.base is not None else []}
    for n in layout.named:
        groups.setdefault(n.group, [])
        groups[n.group].append({"binding": n.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": _TYPES[n.role]}})
    return {g: groups.get(g, []) for g in range(max(groups) + 1)}
