"""Pipeline-overridable constants: a call's ``constants`` checked against
the kernel's ``override`` declarations (gpu/wgsl/wgsl_reflect.py), and an
override-sized ``@workgroup_size`` resolved to numbers (docs/kernels.md).

* every name must be an override the kernel declares (its name, or the
  digits of its ``@id``); an unknown one is bad_args naming it and the
  known ones, never ignored (a misspelt SCALE would run with the default);
* every override without a default must be given: bad_args naming them
  all (naga would refuse the pipeline with a message about "overrides",
  not which ones). kem does not trace which overrides an entry point
  uses, so this holds for every override the kernel declares;
* a value must fit its type: u32 and i32 integers in range, f32 and f16
  finite within their largest values, bool 0 or 1 (WebGPU passes every
  constant as a double, and a u32 of -1 or 1.5 is refused by the spec).

What WebGPU receives is keyed as it wants: an override with ``@id(N)`` by
N's digits, any other by its name.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kem_port.errors import bad_args
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint, KernelShape, Override, parse_int_literal

INTEGER_RANGES = {"u32": (0, 2**32 - 1), "i32": (-(2**31), 2**31 - 1)}
FLOAT_MAX = {"f32": 3.4028234663852886e38, "f16": 65504.0}


def pipeline_constants(shape: KernelShape, given: tuple[tuple[str, int | float], ...] | None) -> dict[str, float]:
    """The call's constants as WebGPU's compute stage takes them (checked
    by resolve_entry first): keyed by @id digits or name, as doubles."""
    if not given:
        return {}
    by_name = {o.name: o for o in shape.overrides} | {str(o.id): o for o in shape.overrides if o.id is not None}
    return {by_name[name].key: float(value) for name, value in given}


def resolved(shape: KernelShape, given: tuple[tuple[str, int | float], ...] | None) -> dict[str, int | float]:
    """Each override's value by name: the caller's, else a literal default
    (an expression default is left to naga: absent here)."""
    by_name = {o.name: o for o in shape.overrides}
    by_id = {str(o.id): o for o in shape.overrides if o.id is not None}
    values: dict[str, int | float] = {}
    for name, value in given or ():
        override = by_name.get(name) or by_id.get(name)
        if override is None:
            known = ", ".join(o.name for o in shape.overrides) or "none"
            raise bad_args(f"constants: the kernel declares no override {name!r} (its overrides: {known})")
        _check_value(override, value)
        values[override.name] = value
    missing = [o.name for o in shape.overrides if not o.has_default and o.name not in values]
    if missing:
        raise bad_args(f"constants: override {', '.join(missing)} has no default; pass constants => #{{{missing[0]} => Value}}")
    for o in shape.overrides:
        if o.name not in values and o.default is not None:
            values[o.name] = o.default
    return values


def _check_value(override: Override, value: int | float) -> None:
    kind, name = override.type, override.name
    if kind in INTEGER_RANGES:
        low, high = INTEGER_RANGES[kind]
        if type(value) is not int or not low <= value <= high:
            raise bad_args(f"constants: {name} is a {kind}: an integer in {low}..{high}, not {value!r}")
    elif kind in FLOAT_MAX:
        if not (math.isfinite(value) and abs(value) <= FLOAT_MAX[kind]):
            raise bad_args(f"constants: {name} is an {kind}: a finite number up to {FLOAT_MAX[kind]:g}, not {value!r}")
    elif kind == "bool":
        if value not in (0, 1):
            raise bad_args(f"constants: {name} is a bool: 0 or 1, not {value!r}")


def workgroup_size(entry: EntryPoint, shape: KernelShape, values: dict[str, int | float]) -> EntryPoint:
    """The entry point with an override-sized ``@workgroup_size`` read as
    numbers (each argument an integer literal or an override's name); as
    it was when that cannot be done (an expression: the dispatch rules then
    ask for workgroups)."""
    if entry.workgroup_size is not None or not entry.workgroup_size_text:
        return entry
    sizes: list[int] = []
    for arg in entry.workgroup_size_text.split(","):
        text = arg.strip()
        number = parse_int_literal(text) if text[:1].isdigit() else values.get(text)
        if type(number) is not int or number < 1:
            return entry
        sizes.append(number)
    if not 1 <= len(sizes) <= 3:
        return entry
    return replace(entry, workgroup_size=tuple((sizes + [1, 1])[:3]))  # type: ignore[arg-type]


def check_workgroup_limits(entry: EntryPoint | None, limits) -> None:
    """A workgroup size within the device's limits, checked by kem: wgpu
    (wgpu-native 22 on lavapipe, limits 1024 a dimension and 1024 in all)
    built and ran an override-sized @workgroup_size(WG) with WG = 4096
    without a word, so an override's size is never left to it."""
    if entry is None or entry.workgroup_size is None:
        return
    x, y, z = entry.workgroup_size
    caps = [int(limits.get(f"max-compute-workgroup-size-{axis}", 0)) for axis in "xyz"]
    total = int(limits.get("max-compute-invocations-per-workgroup", 0))
    over = [f"{axis} {size} > {cap}" for axis, size, cap in zip("xyz", (x, y, z), caps) if cap and size > cap]
    if total and x * y * z > total:
        over.append(f"{x}x{y}x{z} = {x * y * z} invocations > {total}")
    if over:
        raise bad_args(f"@workgroup_size({entry.workgroup_size_text}) is ({x}, {y}, {z}): over this device's limits ({'; '.join(over)})")


def resolve_entry(entry: EntryPoint | None, shape: KernelShape, given: tuple[tuple[str, int | float], ...] | None) -> EntryPoint | None:
    """Check the call's constants against the kernel; its entry point with
    the workgroup size they give."""
    if not shape.overrides:
        if given:
            raise bad_args(f"constants: the kernel declares no override {given[0][0]!r} (its overrides: none)")
        return entry
    values = resolved(shape, given)
    return workgroup_size(entry, shape, values) if entry is not None else None


def set_key(given: tuple[tuple[str, int | float], ...]) -> tuple:
    """A constants set as a cache or admission key: the set, then the sign
    of each float (0.0 == -0.0 and hash alike in Python, but not in WGSL:
    red team, -0.0's call got the pipeline built for 0.0, bitcast told)."""
    return given, tuple(math.copysign(1.0, v) < 0 for _, v in given if isinstance(v, float))
