"""Gas: a kernel's canonical text with every loop counted and capped.

WGSL has no recursion (naga refuses a cycle in the call graph), so an
invocation runs long only through ``loop``, ``for`` and ``while``, which
are reserved words: every such token in the canonical token stream
(gpu/wgsl/wgsl_canonical.py, the one text kem compiles) gets a tick at the
start of its body, right after the body's ``{`` (a loop header holds no
brace: WGSL expressions have none). The transform counts the ticks it
placed against the loop tokens and refuses the kernel (``bad_kernel``,
"line:col") when they differ or a loop keyword has no body brace: it never
hands on a loop it did not account for.

A tick adds one to a per-invocation counter ``kem_gas_n`` (var<private>)
and breaks out of its loop when the count passes the per-invocation cap
the host binds (``kem_gas_cap.x``, a var<uniform>). An inner loop that
breaks leaves the outer loop's next tick to break it too, so every level
exits within a tick; between ticks runs only straight-line code, so an
invocation's work is bounded by (cap + nesting) times its code's size.
At every ``@compute`` entry point's ``return`` and at its end (one form
per kernel, whichever entry point a call names) the invocation adds
its count to the meter (var<storage, read_write>, atomics: the 64-bit
total as low and high words with a carry, and a "ran out" word set when
its count passed the cap). The host reads the meter back with the outputs
(docs/metering.md defines gas from it).

Uniformity. A loop whose body reaches a barrier (workgroupBarrier,
storageBarrier, textureBarrier, workgroupUniformLoad: in the body or in a
function the body calls, at any depth) must break in workgroup-uniform
control flow, else some invocations wait at a barrier the others left.
Tried on wgpu 0.32 (naga) with lavapipe: naga accepts a barrier in a loop
that breaks on a private counter, on a builtin, on anything; it does not
enforce WGSL's uniformity rule for barriers, so its acceptance proves
nothing and the transform must be uniform by construction. A per-invocation
count is not uniform (invocations loop different numbers of times before
they reach the barrier loop), so such a loop breaks on a second counter,
``kem_gas_u`` (var<private>), ticked only by barrier loops: the WGSL spec
requires a barrier's loop to run in uniform control flow with a uniform
trip count, so every invocation of a workgroup ticks it the same number of
times and the break is uniform. It still ticks ``kem_gas_n`` (the gas), and
``kem_gas_u <= kem_gas_n``, so "ran out" is still ``kem_gas_n > cap``.
Rejected: ``workgroupUniformLoad`` of a workgroup flag (uniform whatever
the kernel does, but a barrier per iteration) and a function-local counter
(resets at each call: a barrier loop in a helper called from a barrier loop
could run cap^2 times). kem reserves the barrier builtins' names (a kernel
that declares one is refused: its own function of that name would be read
as a barrier) and a barrier function's name (a local of that name would be
read as a call).

The meter binds at ``@group(1)``: kem's contract (gpu/contract.py) binds a
kernel at group 0 only and refuses any other group, so group 1 cannot
collide; the transform refuses a kernel that declares a group >= 1 all the
same. Every injected name starts with ``kem_gas_``; a kernel with any token
of that prefix is refused. Injected code goes on the lines it belongs to
(ticks after a ``{``, flushes before a ``return``) and the declarations
after the kernel's last line, so naga's line numbers still point into the
author's file. A kernel without a loop token is returned unchanged and
unmetered: its gas is its invocations, counted by the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import names_declared_in, position, tokens
from kem_port.gpu.wgsl.wgsl_reflect import parse_int_literal

PREFIX = "kem_gas_"
GROUP = 1  # the meter's bind group: kem binds kernels at group 0 only
CAP_BINDING, METER_BINDING = 0, 1
CAP_BYTES = 16  # vec4<u32>: x is the cap (a uniform binding is 16 bytes at least)
METER_BYTES = 16  # [low, high, ran out, unused] u32 words
LOOP_WORDS = frozenset(("loop", "for", "while"))
BARRIERS = frozenset(("workgroupBarrier", "storageBarrier", "textureBarrier", "workgroupUniformLoad"))
# Predeclared names the injected code uses: WGSL lets a module-scope
# declaration shadow them (naga follows), and a kernel's own `fn min`
# returning 0 kept a tick's count at 1 (5000 iterations ran past a cap of
# 100, "not ran out": red team of this module), so declaring one is refused.
INJECTED = frozenset(("min", "atomicAdd", "atomicMax", "u32", "vec4", "array", "atomic"))

# kem_gas_n saturates below 2^32 (one min): ticks past the cap (a loop's
# first tick after an inner one broke, per entry) could otherwise wrap it
# past 2^32 in a barrier loop's cap iterations and hide that it ran out.
_TICK = "kem_gas_n = min(kem_gas_n, 4294967294u) + 1u; if (kem_gas_n > kem_gas_cap.x) { break; } "
_UNIFORM_TICK = "kem_gas_n = min(kem_gas_n, 4294967294u) + 1u; kem_gas_u += 1u; if (kem_gas_u > kem_gas_cap.x) { break; } "
_FLUSH = "kem_gas_flush(); "
_DECLARATIONS = f"""
@group({GROUP}) @binding({CAP_BINDING}) var<uniform> kem_gas_cap: vec4<u32>;
@group({GROUP}) @binding({METER_BINDING}) var<storage, read_write> kem_gas_meter: array<atomic<u32>, 4>;
var<private> kem_gas_n: u32;
var<private> kem_gas_u: u32;
fn kem_gas_flush() {{
  let n = kem_gas_n;
  if (n > kem_gas_cap.x) {{ atomicMax(&kem_gas_meter[2], 1u); }}
  if (n != 0u) {{
    let old = atomicAdd(&kem_gas_meter[0], n);
    if (old + n < old) {{ atomicAdd(&kem_gas_meter[1], 1u); }}
  }}
}}
"""


@dataclass(frozen=True)
class GasForm:
    text: str  # what is compiled
    metered: bool  # the host binds the cap and meter at GROUP (False: no loop, text unchanged)
    loops: int = 0  # loop statements ticked
    uniform_loops: int = 0  # of which reach a barrier (tick kem_gas_u)


@dataclass(frozen=True)
class _Function:
    name: str
    open: int  # token index of the body's '{'
    close: int  # token index of its '}'


def gas_form(text: str) -> GasForm:
    """text (canonical) with every loop ticked and every @compute entry
    point's exits flushed (one form per kernel, whichever entry a call
    names: kem keeps one admitted text per kernel); KemError
    ``bad_kernel`` for anything the transform cannot account for. Cached:
    the same text is transformed once."""
    return _gas_form(text)


@lru_cache(maxsize=64)
def _gas_form(text: str) -> GasForm:
    toks = list(tokens(text))
    values = [value for _, value, _ in toks]
    _check_names(text, toks, values, False)  # every kernel: only a gas form has kem's names
    loop_at = [i for i, value in enumerate(values) if value in LOOP_WORDS]
    if not loop_at:
        return GasForm(text, False)
    _check_names(text, toks, values, True)
    functions, entries = _functions(text, toks, values)
    barrier_fns = _barrier_functions(values, functions)
    _check_shadowing(text, toks, values, barrier_fns)
    inserts: list[tuple[int, str]] = []
    uniform = 0
    for i in loop_at:
        body, close = _loop_body(text, toks, values, i)
        reaches = _reaches_barrier(values[i + 1 : close], barrier_fns)  # header and body
        uniform += reaches
        inserts.append((toks[body][2] + 1, _UNIFORM_TICK if reaches else _TICK))
    if len(inserts) != len(loop_at):  # one tick per loop token, or nothing runs
        raise KemError("bad_kernel", f"{len(loop_at)} loop keywords, {len(inserts)} ticked")
    for name in entries:
        inserts += _flushes(toks, values, functions[name])
    return GasForm(_apply(text, inserts) + _DECLARATIONS, True, len(loop_at), uniform)


def metered(shape) -> bool:
    """Whether a reflected text (wgsl_reflect.KernelShape) is a metered gas form: it binds the meter."""
    return any(b.group == GROUP and b.name.startswith(PREFIX) for b in shape.bindings)


def _refuse(text: str, offset: int, why: str) -> KemError:
    line, column = position(text, offset)
    return KemError("bad_kernel", f"{line}:{column}: {why}")


def _check_names(text: str, toks: list, values: list[str], groups: bool) -> None:
    """No token of kem's prefix; with groups, no group but 0 (the meter's
    is GROUP; a loop-free kernel is not metered, and sessions bind more groups)."""
    for i, value in enumerate(values):
        if not groups and value.startswith(PREFIX):
            raise _refuse(text, toks[i][2], f"{value}: names starting {PREFIX} are kem's (gas metering)")
        if groups and value == "group" and i > 0 and values[i - 1] == "@" and not _is_zero(values[i + 1 : i + 3]):
            raise _refuse(text, toks[i][2], f"kem binds kernels at @group(0) only (the gas meter is @group({GROUP}))")


def _is_zero(pair: list[str]) -> bool:
    return len(pair) == 2 and pair[0] == "(" and parse_int_literal(pair[1]) == 0


def _functions(text: str, toks: list, values: list[str]) -> tuple[dict[str, _Function], list[str]]:
    """Each module-scope function's body (a function header holds no
    brace), and the names of those with an ``@compute`` attribute."""
    found: dict[str, _Function] = {}
    entries: list[str] = []
    depth, i, compute = 0, 0, False
    while i < len(values):
        value = values[i]
        if depth == 0 and value == "@" and values[i + 1 : i + 2] == ["compute"]:
            compute = True
        elif value == "fn" and depth == 0 and i + 1 < len(values):
            start = _next_brace(values, i)
            if start is None or values[start] != "{":
                raise _refuse(text, toks[i][2], "a function without a body")
            close = _matching(values, start)
            if close is None:
                raise _refuse(text, toks[start][2], "a '{' never closed")
            found[values[i + 1]] = _Function(values[i + 1], start, close)
            entries += [values[i + 1]] if compute else []
            i, compute = close + 1, False
            continue
        elif depth == 0 and value in (";", "}"):
            compute = False
        depth += (value == "{") - (value == "}")
        i += 1
    return found, entries


def _next_brace(values: list[str], i: int) -> int | None:
    for j in range(i + 1, len(values)):
        if values[j] in ("{", "}"):
            return j
    return None


def _matching(values: list[str], open_at: int) -> int | None:
    depth = 0
    for j in range(open_at, len(values)):
        depth += (values[j] == "{") - (values[j] == "}")
        if depth == 0:
            return j
    return None


def _barrier_functions(values: list[str], functions: dict[str, _Function]) -> frozenset[str]:
    """Functions that reach a barrier, directly or through a call (a fixed
    point over the call graph, which has no cycle)."""
    calls = {name: set(values[f.open : f.close]) for name, f in functions.items()}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, used in calls.items():
            if name not in found and (used & BARRIERS or used & found):
                found.add(name)
                changed = True
    return frozenset(found)


def _check_shadowing(text: str, toks: list, values: list[str], barrier_fns: frozenset[str]) -> None:
    """A declared barrier builtin, or a barrier function's name declared
    again (a local, a parameter), would make _reaches_barrier misread."""
    declared = names_declared_in(values)
    # By a keyword only: a struct member named min (an AABB's) shadows nothing;
    # a parameter or local of such a name fails naga's compile of the form.
    used = INJECTED & names_declared_in([";" if v == ":" else v for v in values])
    if used:
        name = sorted(used)[0]
        raise _refuse(text, toks[values.index(name)][2], f"{name}: a name kem's gas code uses (docs/metering.md); declare another")
    other = names_declared_in([";" if v == "fn" else v for v in values])  # names not declared by fn
    clash = (set(BARRIERS) & declared) | (other & barrier_fns)
    if clash:
        name = sorted(clash)[0]
        raise _refuse(text, toks[values.index(name)][2], f"{name}: kem reserves barrier names (gas metering)")


def _loop_body(text: str, toks: list, values: list[str], i: int) -> tuple[int, int]:
    body = _next_brace(values, i)
    if body is None or values[body] != "{":
        raise _refuse(text, toks[i][2], f"'{values[i]}' without a body kem can find")
    close = _matching(values, body)
    if close is None:
        raise _refuse(text, toks[body][2], "a loop body never closed")
    return body, close


def _reaches_barrier(body: list[str], barrier_fns: frozenset[str]) -> bool:
    names = set(body)
    return bool(names & BARRIERS or names & barrier_fns)


def _flushes(toks: list, values: list[str], main: _Function) -> list[tuple[int, str]]:
    """A flush before each return of the entry point and before its end
    (unless its last statement is a return: nothing after it would run)."""
    inserts = [(toks[j][2], _FLUSH) for j in range(main.open + 1, main.close) if values[j] == "return"]
    if values[main.close - 2 : main.close] != ["return", ";"]:
        inserts.append((toks[main.close][2], _FLUSH))
    return inserts


def _apply(text: str, inserts: list[tuple[int, str]]) -> str:
    out, at = [], 0
    for offset, code in sorted(inserts, key=lambda pair: pair[0]):
        out.append(text[at:offset])
        out.append(code)
        at = offset
    out.append(text[at:])
    return "".join(out)
