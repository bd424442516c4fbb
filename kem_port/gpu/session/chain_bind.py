"""A kernel step's named bindings: which buffer or bytes each one binds.

For each binding the entry point uses, other than a kem@1.0-shaped
kernel's 0-2 (session_contract.py), in this order:

1. bytes the step gives for it, ``buffers => #{WgslName => Bin}``: a
   uniform's contents, or a storage buffer made for this step alone (a
   ``read_write`` one is an in/out buffer: the step returns it changed);
2. a uniform without bytes is ``bad_args`` (session buffers are storage);
3. otherwise the buffer named like the WGSL variable, or as ``bind =>
   #{WgslName => BufferName}`` renames it: one ``outputs => #{Name =>
   Bytes}`` makes (a new zeroed temporary a later step or ``return`` can
   name), one an earlier step made, or a session buffer (written in place
   when the binding is ``read_write``).

Sizes are checked as a single call's are (gpu/named/binding_model.py):
a fixed-size type is filled, an array holds whole elements (WebGPU's
per-stage buffer counts: session_contract.py, once per pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kem_port.errors import bad_args, too_large
from kem_port.gpu.named.binding_model import Bound, Limits, check_sizes, keys_of
from kem_port.gpu.session.chain_budget import ChainBudget
from kem_port.gpu.session.chain_steps import Slot, Step
from kem_port.gpu.session.session_contract import NamedBinding, SessionLayout


class Buffers(Protocol):
    """What the planner lends: name lookup, new temporaries, its budget."""

    budget: ChainBudget

    def lookup(self, name: str) -> Slot: ...

    def known(self, name: str) -> bool: ...

    def temporary(self, name: str | None, size: int) -> Slot: ...


@dataclass
class Named:
    storage: list[tuple[NamedBinding, Slot]] = field(default_factory=list)
    uniforms: list[tuple[int, int, bytes]] = field(default_factory=list)
    results: dict[str, Slot] = field(default_factory=dict)


NONE = Named()  # a kem@1.0 step with nothing named: ~2.5 us a step saved (never changed)


def bind_named(step: Step, layout: SessionLayout, buffers: Buffers, limits: Limits) -> Named:
    """The step's named bindings bound; the layout's buffer counts were
    checked once, when its pipeline was made (session_contract.py)."""
    if not (layout.named or step.bind or step.buffers or step.outputs):
        return NONE
    if step.bind or step.buffers:
        _check_keys(step, layout)
    named = Named()
    for n in layout.named:
        data = next((step.buffers[k] for k in keys_of(n.declared) if k in step.buffers), None) if step.buffers else None
        if n.role == "uniform":
            named.uniforms.append((n.group, n.binding, _uniform(n, data, limits)))
            # One request's bytes: 256 steps of 64 uniforms each would otherwise pack unbounded.
            buffers.budget.add_bytes(len(data or b""), f"uniform {n.wgsl_name!r}")
            continue
        if data is not None:
            slot = buffers.temporary(None, len(data))
            slot.upload = data
            buffers.budget.add_bytes(slot.size, f"buffer {n.wgsl_name!r}")
            if n.writable:
                named.results[n.wgsl_name] = slot
        else:
            slot = _by_name(step, n, buffers, named)
        if slot.size > limits.storage_binding:
            raise too_large(f"buffer {slot.name or n.wgsl_name!r} of {slot.size} bytes is over this adapter's storage binding limit "
                            f"of {limits.storage_binding}")
        b = n.declared
        # Sizes as a single call's (binding_model.check_sizes), built only when one can fail:
        # a bound size is whole words, so an array of 4-byte elements always fits.
        if b.min_size is not None or (b.element_size and slot.size % b.element_size):
            check_sizes([Bound(b, "inout" if n.writable else "input", None, slot.size, slot.logical)])
        named.storage.append((n, slot))
    if step.outputs:
        unused = sorted(set(step.outputs) - set(named.results))
        if unused:
            raise bad_args(f"outputs names {', '.join(unused)}, which no var<storage, read_write> binding of the kernel binds")
    return named


def _check_keys(step: Step, layout: SessionLayout) -> None:
    names = {n.wgsl_name for n in layout.named}
    unknown = sorted(set(step.bind) - names)
    if unknown:
        raise bad_args(f"bind names {', '.join(unknown)}, which the kernel does not bind by name "
                       f"(its named bindings: {', '.join(sorted(names)) or 'none'})")
    keys = {k for n in layout.named for k in keys_of(n.declared)}
    stray = sorted(set(step.buffers) - keys)
    if stray:
        raise bad_args(f"buffers names {stray[0]!r}, which the kernel does not bind by name "
                       f"(its named bindings: {', '.join(sorted(names)) or 'none'})")


def _uniform(n: NamedBinding, data: bytes | None, limits: Limits) -> bytes:
    if data is None:
        raise bad_args(f"uniform {n.wgsl_name!r} takes its bytes from the step: buffers => #{{{n.wgsl_name} => Bin}}")
    if n.declared.min_size is not None and len(data) < n.declared.min_size:
        raise bad_args(f"uniform {n.wgsl_name!r} is {n.declared.min_size} bytes; {len(data)} given")
    if len(data) > limits.uniform_binding:
        raise too_large(f"uniform {n.wgsl_name!r} of {len(data)} bytes is over this adapter's {limits.uniform_binding}")
    return data


def _by_name(step: Step, n: NamedBinding, buffers: Buffers, named: Named) -> Slot:
    name = step.bind.get(n.wgsl_name, n.wgsl_name)
    size = step.outputs.get(name)
    if size is None:
        return buffers.lookup(name)
    if not n.writable:
        raise bad_args(f"{n.wgsl_name!r} is var<storage, read>: it reads a buffer, outputs cannot make it")
    if name in named.results or buffers.known(name):
        raise bad_args(f"outputs makes a new buffer {name!r}, but one of that name exists: bind it by name instead")
    buffers.budget.add_bytes(max(size + 3 & ~3, 4), f"output {name!r}")
    slot = buffers.temporary(name, size)
    named.results[name] = slot
    return slot
