"""Which buffer goes to each binding of a kernel, by reflection.

Every resource binding the kernel declares, in any bind group WebGPU allows
(0-3) and at any binding number, takes its role from its declaration:
``var<storage, read>`` an input, ``var<storage, read_write>`` an output
(sized by the caller) or an in/out buffer (given bytes, returned changed),
``var<uniform>`` a uniform. The caller names buffers by WGSL variable name,
or as ``"G/B"`` (group/binding) or a bare binding number in group 0.
Anything kem cannot know is a ``bad_args`` naming the buffer, never a
guess: an output without a size, a buffer for no binding, a uniform shorter
than its type, a texture or sampler (kem binds buffers only).
"""

from __future__ import annotations

from dataclasses import dataclass

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.wgsl.wgsl_reflect import Binding, KernelShape

MAX_GROUPS = 4  # WebGPU's maxBindGroups default, and every adapter's
UNIFORM_ALIGN = 16
# The refusal of a kernel outside kem@1.0's shape given no dispatch: a
# single call by named buffers and a session call or chain step say the same.
NEEDS_DISPATCH = ("a call by named buffers gives its dispatch: grid => {X, Y, Z} (invocations) or workgroups; "
                  "kem's default rules are for kem@1.0-shaped kernels only (docs/dispatch.md)")


@dataclass(frozen=True)
class NamedCall:
    """A call by named buffers, checked for shape and size on the wire."""

    kernel_id: str
    buffers: dict[str, bytes]  # by name, "G/B" or "B"
    outputs: dict[str, int]  # output sizes in bytes, by the same keys
    workgroups: tuple[int, int, int] | None = None
    entry_point: str = "main"
    grid: tuple[int, int, int] | None = None  # invocations (gpu/dispatch.py)
    constants: tuple[tuple[str, int | float], ...] | None = None  # pipeline constants (gpu/constants.py)
    gas_limit: int | None = None  # the call's gas budget (docs/metering.md); None: the node's KEM_GAS_LIMIT

    @property
    def batch_bytes(self) -> int:
        return max(sum(map(len, self.buffers.values())), sum(self.outputs.values()))


@dataclass(frozen=True)
class Bound:
    """One binding of a call: its role, its first contents, its sizes."""

    binding: Binding
    role: str  # "input", "output", "inout" or "uniform"
    data: bytes | None  # what it holds before the dispatch (None: zeros)
    size: int  # bytes bound (padded: storage to 4, a uniform to 16)
    logical: int  # bytes the caller gets back (outputs and in/outs)

    @property
    def returned(self) -> bool:
        return self.role in ("output", "inout")


@dataclass(frozen=True)
class Limits:
    storage_binding: int  # bytes
    uniform_binding: int
    storage_per_stage: int = 8  # WebGPU's defaults, which kem requests
    uniform_per_stage: int = 12


def role_of(b: Binding) -> str:
    if b.address_space == "storage":
        return "output" if b.access == "read_write" else "input"
    if b.address_space == "uniform":
        return "uniform"
    raise KemError("bad_kernel", f"{b.name} at @group({b.group}) @binding({b.binding}) is not a buffer: kem binds "
                                 "storage and uniform buffers only")


def keys_of(b: Binding) -> tuple[str, ...]:
    """The names a caller may give a binding's buffer under."""
    keys = (b.name, f"{b.group}/{b.binding}")
    return keys + ((str(b.binding),) if b.group == 0 else ())


def plan_bindings(shape: KernelShape, call: NamedCall, limits: Limits, used: set[str] | None = None) -> list[Bound]:
    """Every binding the entry point uses (``used``: the names its code
    reaches, gpu/wgsl/wgsl_calls.used_names; None: every binding declared)
    with its buffer, or bad_args naming the problem. A buffer given for a
    binding the entry point does not use is not bound, as WebGPU's own
    "auto" layout leaves it out."""
    declared = sorted(shape.bindings, key=lambda b: (b.group, b.binding))
    _check_keys(declared, call)
    bindings = [b for b in declared if used is None or b.name in used]
    if not bindings:
        raise bad_args("the entry point uses no buffers: nothing to bind or return")
    if any(b.group >= MAX_GROUPS for b in bindings):
        raise KemError("bad_kernel", f"WebGPU has bind groups 0-{MAX_GROUPS - 1}")
    for a, b in zip(bindings, bindings[1:]):  # WGSL allows it across entry points; one layout cannot hold both
        if (a.group, a.binding) == (b.group, b.binding):
            raise KemError("bad_kernel", f"{a.name!r} and {b.name!r} are both at @group({a.group}) @binding({a.binding}): "
                                         "kem binds every buffer the entry point uses, each at its own binding")
    if not any(role_of(b) == "output" for b in bindings):
        raise KemError("bad_kernel", "the kernel writes no buffer (no var<storage, read_write>): nothing would come back")
    bound = [_bind(b, call, limits) for b in bindings]
    check_counts(bound, limits)
    return bound


def _check_keys(bindings: list[Binding], call: NamedCall) -> None:
    known = {key: b for b in bindings for key in keys_of(b)}
    for where in (call.buffers, call.outputs):
        unknown = sorted(k for k in where if k not in known)
        if unknown:
            names = ", ".join(b.name for b in bindings)
            raise bad_args(f"no binding named {unknown[0]!r} in the kernel (its buffers: {names})")
    for b in bindings:
        given = [k for k in keys_of(b) if k in call.buffers or k in call.outputs]
        if len(given) > 1:
            raise bad_args(f"buffer {b.name!r} given twice ({' and '.join(repr(k) for k in given)})")


def _given(b: Binding, where: dict):
    return next((where[k] for k in keys_of(b) if k in where), None)


def _bind(b: Binding, call: NamedCall, limits: Limits) -> Bound:
    role, data, size = role_of(b), _given(b, call.buffers), _given(b, call.outputs)
    if role != "output" and size is not None:
        raise bad_args(f"{b.name!r} is {_declared(b)}, an input: give its bytes, not an output size")
    if role == "uniform":
        return _uniform(b, data, limits)
    if role == "input":
        if data is None:
            raise bad_args(f"input {b.name!r} ({_declared(b)}) was not given")
        return _storage(b, "input", data, len(data), limits)
    if data is not None and size is not None:
        raise bad_args(f"{b.name!r}: give its bytes (an in/out buffer) or an output size, not both")
    if data is not None:
        return _storage(b, "inout", data, len(data), limits)
    if size is None:
        raise bad_args(f"output {b.name!r} ({_declared(b)}) needs a size: outputs => #{{{b.name} => Bytes}}, "
                       "or its bytes to use it in place")
    return _storage(b, "output", None, size, limits)


def _uniform(b: Binding, data: bytes | None, limits: Limits) -> Bound:
    if data is None:
        raise bad_args(f"uniform {b.name!r} was not given")
    if b.min_size is not None and len(data) < b.min_size:
        raise bad_args(f"uniform {b.name!r} is {b.min_size} bytes; {len(data)} given")
    size = max(-(-len(data) // UNIFORM_ALIGN) * UNIFORM_ALIGN, UNIFORM_ALIGN)
    if size > limits.uniform_binding:
        raise too_large(f"uniform {b.name!r} of {len(data)} bytes is over this adapter's {limits.uniform_binding}")
    return Bound(b, "uniform", data, size, 0)


def _storage(b: Binding, role: str, data: bytes | None, logical: int, limits: Limits) -> Bound:
    size = max((logical + 3) & ~3, 4)
    if size > limits.storage_binding:
        raise too_large(f"{b.name!r} of {logical} bytes is over this adapter's storage binding limit of {limits.storage_binding}")
    return Bound(b, role, data, size, logical)


def check_sizes(bound: list[Bound]) -> None:
    """Each storage buffer fills its type, before a call runs (not in kem
    check's probe, whose 4-byte buffers stand for any size)."""
    for x in bound:
        b = x.binding
        if x.role == "uniform":
            continue
        # WebGPU refuses a binding shorter than a fixed-size type only once the
        # dispatch is encoded (4 bytes for array<u32, 64>: gpu_error in wgpu's words).
        if b.min_size is not None and x.logical < b.min_size:
            raise bad_args(f"{b.name!r} ({_declared(b)}) is {b.min_size} bytes; {x.logical} given")
        # Part of an element is not seen by the kernel (arrayLength rounds down):
        # 20 bytes of vec4<u32> would come back as 16 computed bytes and 4 zeros.
        if b.element_size and x.size % b.element_size:
            raise bad_args(f"{b.name!r} ({_declared(b)}) holds {b.element_size}-byte elements; "
                           f"{x.logical} bytes is not a whole number of them")


def check_counts(bound: list[Bound], limits: Limits) -> None:
    storage = sum(1 for x in bound if x.role != "uniform")
    uniforms = len(bound) - storage
    if storage > limits.storage_per_stage:
        raise KemError("bad_kernel", f"{storage} storage buffers; WebGPU allows {limits.storage_per_stage} in a compute stage")
    if uniforms > limits.uniform_per_stage:
        raise KemError("bad_kernel", f"{uniforms} uniform buffers; WebGPU allows {limits.uniform_per_stage} in a compute stage")


def _declared(b: Binding) -> str:
    access = f", {b.access}" if b.access else ""
    return f"@group({b.group}) @binding({b.binding}) var<{b.address_space}{access}>"
