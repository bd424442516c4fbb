"""Pipeline-overridable constants: a call's ``constants`` checked against
the kernel's ``override`` declarations (gpu/wgsl/wgsl_reflect.py), and an
override-sized ``@workgroup_size`` resolved to numbers (docs/kernels.md).

* every name must be an override the kernel declares (its name, or the
  digits of its ``@id``, not both); an unknown one is bad_args naming it
  (a misspelt SCALE would run with the default);
* every override without a default must be given: bad_args naming them
  all (naga would refuse the pipeline with a message about "overrides",
  not which ones). kem does not trace which overrides an entry point
  uses, so this holds for every override the kernel declares;
* a value must fit its type: u32 and i32 integers in range, f32 and f16
  finite, bool 0 or 1 (WebGPU passes doubles; the spec refuses a u32 of 1.5).

What WebGPU receives is keyed as it wants: an override with ``@id(N)`` by
N's digits, any other by its name.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from functools import lru_cache

from kem_port.errors import bad_args, first_names
from kem_port.gpu.wgsl.wgsl_counts import count_value
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint, KernelShape, Override, parse_int_literal

INTEGER_RANGES = {"u32": (0, 2**32 - 1), "i32": (-(2**31), 2**31 - 1)}
FLOAT_MAX = {"f32": 3.4028234663852886e38, "f16": 65504.0}
# admission/limits.py's MAX_WORKGROUP_ELEMENTS, the bound on a var<workgroup>
# array sized by literals (admission sits above gpu/, so it is restated
# here; tests/test_constants_bounds.py holds them equal). An array sized by
# an override is held to it per constants set: N = 2^28 - 1 asked the
# compiler for 1 GiB of workgroup memory and killed the admission worker.
MAX_WORKGROUP_ELEMENTS = 65_536
_ARRAY = re.compile(r"array\s*<(.*)>", re.S)
_OVERRIDE_NAME = re.compile(r"\b[A-Za-z_]\w*")
_CALLS = re.compile(r"\b(?:min|max)\s*(?=\()")  # the builtins a count may call (WGSL's min/max of integers)


def pipeline_constants(shape: KernelShape, given: tuple[tuple[str, int | float], ...] | None) -> dict[str, float]:
    """The call's constants as WebGPU's compute stage takes them (checked
    by resolve_entry first): keyed by @id digits or name, as doubles."""
    if not given:
        return {}
    resolved(shape, given)  # bad_args naming a name it lacks: a chain step's admission KeyError'd (500, red team)
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
            known = first_names([o.name for o in shape.overrides]) or "none"
            raise bad_args(f"constants: the kernel declares no override {name!r} (its overrides: {known})")
        _check_value(override, value)
        if override.name in values:  # its name and its @id's digits: one value was kept, unsaid (red team)
            raise bad_args(f"constants: {override.name} given twice (by its name and its @id)")
        values[override.name] = value
    missing = [o.name for o in shape.overrides if not o.has_default and o.name not in values]
    if missing:
        raise bad_args(f"constants: override {first_names(missing)} has no default; pass constants => #{{{missing[0]} => Value}}")
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


def known_ints(shape: KernelShape, values: dict[str, int | float]) -> dict[str, int]:
    """The integer overrides' values: the call's and literal defaults
    (values), then defaults that are expressions (HALF = WG / 2u) and the
    module's consts where reflect read them (KernelShape.const_inits),
    each evaluated with the values known so far."""
    known = {k: v for k, v in values.items() if type(v) is int}
    inits = shape.const_inits + shape.override_inits  # a const names consts only
    for _ in range(len(inits)):  # an override's default may name another's: WG / 2u
        later = {name: count_value(init, known) for name, init in inits if name not in values and name not in known}
        found = {name: number for name, number in later.items() if number is not None}
        if not found:
            break
        known |= found
    return known


def check_workgroup_arrays(shape: KernelShape, values: dict[str, int | float]) -> None:
    """bad_args naming a var<workgroup> array whose size, with this
    constants set, is over MAX_WORKGROUP_ELEMENTS: checked before any
    compile, for this set only (another set of the same kernel runs).
    Counts may name overrides (given, or their defaults, expressions too)
    and consts (replaced by wgsl_workgroup); one kem cannot read (a function
    call other than min/max, a float) is refused where it names an override."""
    if not shape.workgroup_vars:
        return
    known = known_ints(shape, values)
    ints = tuple(sorted(known.items()))
    overrides = frozenset(o.name for o in shape.overrides)
    for name, type_text in shape.workgroup_vars:
        total, named = _elements(type_text, ints, overrides)
        if total is None:
            raise bad_args(f"constants: var<workgroup> {name}: {type_text}: a count that names an override must be integer "
                           f"literals, override and const names, + - * / % and min/max, for kem to hold it to "
                           f"{MAX_WORKGROUP_ELEMENTS} elements (unread, max(N, 64u) ran N = 2^26 on lavapipe)")
        if named and total > MAX_WORKGROUP_ELEMENTS:
            given = ", ".join(f"{k} = {v}" for k, v in known.items() if re.search(rf"\b{k}\b", type_text))
            raise bad_args(f"constants: var<workgroup> {name}: {type_text} is {total} elements with {given}, "
                           f"over kem's limit of {MAX_WORKGROUP_ELEMENTS} elements a workgroup array")


@lru_cache(maxsize=256)
def _elements(type_text: str, ints: tuple[tuple[str, int], ...], overrides: frozenset[str] = frozenset()) -> tuple[int | None, bool]:
    """(elements, whether an override sizes it) of a workgroup variable's
    type; (None, True) when a count names an override but cannot be read
    (max(N, 64u) went unread to the compiler, which ran N = 2^26: red team
    of wave 3), (0, False) when a count cannot be read and names none (a
    literal count is admission's). Cached: a call of a
    kernel with overrides resolves its entry up to three times (named_run),
    and reading the counts costs ~10 us a time against ~1 us for a lookup."""
    counts = _array_counts(type_text)
    total, named = 1, any(_names_any(c) for c in counts)  # consts were replaced (wgsl_workgroup)
    for count in counts:
        number = _count_of(count, ints)
        if number is None:  # unread: refused where an override sizes any level (a struct's long count, max(N, 64u)...)
            return (None, True) if overrides & set(_OVERRIDE_NAME.findall(" ".join(counts))) else (0, False)
        total *= max(number, 1)
    return total, named


def literal_elements(type_text: str) -> int | None:
    """The elements of a var<workgroup> type (wgsl_workgroup.py's text)
    whose counts are literals and consts only, for admission's bound
    (admission/limits.py); None when a count names an override (this
    module's, per constants set) or cannot be read."""
    total, _ = _elements(type_text, ())
    return total or None


@lru_cache(maxsize=1024)
def _array_counts(type_text: str) -> tuple[str, ...]:
    """The element count of each array level of a type, outermost first.
    Cached by level: a struct's inner text (up to 4 KiB, wgsl_workgroup.py)
    is scanned once, not once per variable of it (6,000 variables: 3.3 s)."""
    text = type_text.strip()
    array = _ARRAY.fullmatch(text)
    if array is None:
        return ()
    depth, args = 0, array.group(1)
    for i in range(len(args) - 1, -1, -1):  # the count is the last top-level argument
        depth += (args[i] in ">)") - (args[i] in "<(")
        if args[i] == "," and depth == 0:
            return (args[i + 1 :].strip(), *_array_counts(args[:i].strip()))
    return ()  # runtime-sized: no count


@lru_cache(maxsize=1024)
def _names_any(count: str) -> bool:
    """Whether a count names anything but min/max (an override: consts were replaced)."""
    return _OVERRIDE_NAME.search(_CALLS.sub("", count)) is not None


@lru_cache(maxsize=1024)
def _count_of(text: str, ints: tuple[tuple[str, int], ...]) -> int | None:
    """_count, once per (count, values): a struct's count (up to 4 KiB of
    text) is shared by every variable of arrays of it, and 2,000 variables
    parsing it each took 5.7 s of admission (red team of wave 3)."""
    return count_value(text, dict(ints))


def workgroup_size(entry: EntryPoint, shape: KernelShape, values: dict[str, int | float]) -> EntryPoint:
    """The entry point with an override-sized ``@workgroup_size`` read as
    numbers (each argument an integer literal, an override's name or an
    expression of them, overrides' expression defaults included); as it
    was when that cannot be done (the dispatch rules then ask for
    workgroups). Gas counts invocations by it (gpu/gas_meter.py): an
    unread WG = 8u * 8u default counted 1 invocation a workgroup, and the
    call's gas limit did not hold (red team of wave 3)."""
    if entry.workgroup_size is not None or not entry.workgroup_size_text:
        return entry
    known = known_ints(shape, values)
    sizes: list[int] = []
    for arg in _top_level_args(entry.workgroup_size_text):
        text = arg.strip()
        number = known[text] if text in known else parse_int_literal(text)
        number = count_value(text, known) if number is None else number  # an expression: ~10 us, names and literals ~0.1
        if type(number) is not int or number < 1:
            return entry
        sizes.append(number)
    if not 1 <= len(sizes) <= 3:
        return entry
    return replace(entry, workgroup_size=tuple((sizes + [1, 1])[:3]))  # type: ignore[arg-type]


def _top_level_args(text: str) -> list[str]:
    """Arguments split at commas outside parentheses (``max(A, B), 1``)."""
    args, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            args.append(text[start:i])
            start = i + 1
    return args + [text[start:]]



def resolve_entry(entry: EntryPoint | None, shape: KernelShape, given: tuple[tuple[str, int | float], ...] | None) -> EntryPoint | None:
    """Check the call's constants against the kernel; its entry point with
    the workgroup size they give."""
    if not shape.overrides:
        if given:
            raise bad_args(f"constants: the kernel declares no override {given[0][0]!r} (its overrides: none)")
        return workgroup_size(entry, shape, {}) if entry is not None and shape.const_inits else entry
    values = resolved(shape, given)
    check_workgroup_arrays(shape, values)
    return workgroup_size(entry, shape, values) if entry is not None else None


def set_key(given: tuple[tuple[str, int | float], ...]) -> tuple:
    """A constants set as a cache or admission key: the set, then each value's kind and sign in place (0 == -0.0
    and 1 == 1.0 in Python, not in WGSL or the checks: {A => 0, B => -0.0} and {A => -0.0, B => 0} were one key,
    and {N => 1.0} for a u32 ran on {N => 1}'s plan: red team, bitcast told)."""
    return given, tuple((type(v) is float, math.copysign(1.0, v) < 0) for _, v in given)
