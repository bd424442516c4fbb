"""Gas: a kernel's canonical text with every loop counted and capped.

WGSL has no recursion (naga refuses a cycle in the call graph), so an
invocation runs long only through ``loop``, ``for`` and ``while``, reserved
words: each such token of the canonical text (gpu/wgsl/wgsl_canonical.py,
the one text kem compiles) gets a tick right after its body's ``{`` (a loop
header holds no brace). The ticks placed are counted against the loop
tokens, and a kernel is refused (``bad_kernel``, "line:col") when they
differ or a loop has no body brace: no loop is handed on unaccounted.

A tick adds one to ``kem_gas_n`` (var<private>) and breaks out of its loop
when the count passes the cap the host binds (``kem_gas_cap.x``, uniform).
An inner loop that breaks leaves the outer loop's next tick to break it,
so an invocation's work is bounded by (cap + nesting) times its code's
size. At every ``@compute`` entry point's ``return`` and end the invocation
adds its count to the meter (atomics: a 64-bit total as low and high words
with a carry, and a "ran out" word), read back with the outputs.

Uniformity (docs/metering.md has the trials). A loop whose body reaches a
barrier (workgroupBarrier, storageBarrier, textureBarrier,
workgroupUniformLoad, directly or through a called function) must break in
workgroup-uniform control flow, and naga (wgpu 0.32) does not enforce it,
so such a loop breaks on ``kem_gas_u``, a second private counter ticked
only by barrier loops, which the WGSL spec makes run the same number of
times in every invocation of a workgroup. It ticks ``kem_gas_n`` too, and
``kem_gas_u <= kem_gas_n``, so "ran out" is still ``kem_gas_n > cap``.
kem reserves the barrier builtins' names and a barrier function's name.

The meter's bind group is a parameter. The execute road (``group=None``)
binds it at ``@group(1)``: kem's contract (gpu/contract.py) binds kernels
at group 0 only, and the transform refuses any other group there all the
same. Named-buffer runs, sessions and chains bind a kernel's own layout in
any of WebGPU's four groups, so they take ``gas_group``: the lowest group
no binding of the kernel declares (one form per kernel, whichever entry
point runs); a looping kernel that declares all four is refused
(docs/metering.md says why the meter does not share a group). Injected
names start with ``kem_gas_`` (refused in a kernel); ticks and flushes go on
the lines they belong to, the declarations after the kernel's last line
(naga's line numbers point into the author's file). A loop-free kernel is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import names_declared_in, position, tokens
from kem_port.gpu.wgsl.wgsl_reflect import parse_int_literal

PREFIX = "kem_gas_"
GROUP = 1  # the execute road's meter group: kem binds kernels there at group 0 only
MAX_GROUPS = 4  # WebGPU's maxBindGroups default, which kem requests
CAP_BINDING, METER_BINDING = 0, 1
CAP_BYTES = 16  # vec4<u32>: x is the cap (a uniform binding is 16 bytes at least)
METER_BYTES = 16  # [low, high, ran out, unused] u32 words
LOOP_WORDS = frozenset(("loop", "for", "while"))
BARRIERS = frozenset(("workgroupBarrier", "storageBarrier", "textureBarrier", "workgroupUniformLoad"))
# Names the injected declarations use: a module-scope declaration may
# shadow them (a `fn min` returning 0 once let 5000 turns pass a cap of
# 100), so declaring one is refused; a const named `uniform` broke ours.
INJECTED = frozenset(("atomicAdd", "atomicMax", "u32", "vec4", "array", "atomic", "uniform", "storage", "private", "read_write"))

# Ticks sit in the kernel's functions, whose locals may shadow any
# predeclared name (a local `min` broke the old tick), so they use none.
# kem_gas_n saturates below 2^32: ticks past the cap (a loop's first tick
# after an inner one broke) could wrap it in a barrier loop's cap turns.
_TICK = "if (kem_gas_n < 4294967295u) { kem_gas_n += 1u; } if (kem_gas_n > kem_gas_cap.x) { break; } "
_UNIFORM_TICK = "if (kem_gas_n < 4294967295u) { kem_gas_n += 1u; } kem_gas_u += 1u; if (kem_gas_u > kem_gas_cap.x) { break; } "
_FLUSH = "kem_gas_flush(); "
_DECLARATIONS = """
@group({group}) @binding({cap}) var<uniform> kem_gas_cap: vec4<u32>;
@group({group}) @binding({meter}) var<storage, read_write> kem_gas_meter: array<atomic<u32>, 4>;
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
    metered: bool  # the host binds the cap and meter at group (False: no loop, text unchanged)
    loops: int = 0  # loop statements ticked
    uniform_loops: int = 0  # of which reach a barrier (tick kem_gas_u)
    group: int = GROUP  # the meter's bind group (cap at CAP_BINDING, meter at METER_BINDING)


@dataclass(frozen=True)
class _Function:
    name: str
    open: int  # token index of the body's '{'
    close: int  # token index of its '}'


def gas_form(text: str, group: int | None = None) -> GasForm:
    """text (canonical) with every loop ticked and every @compute entry
    point's exits flushed (one form per kernel, whichever entry a call
    names: kem keeps one admitted text per kernel), its meter at ``group``
    (None: the execute road's GROUP, the kernel at group 0 only); KemError
    ``bad_kernel`` for anything the transform cannot account for. Cached:
    the same text is transformed once."""
    return _gas_form(text, group)


def named_gas_form(text: str) -> GasForm:
    """gas_form at gas_group(text): kernels bound by their own layout (named buffers, sessions, chains)."""
    return _gas_form(text, gas_group(text))


@lru_cache(maxsize=64)
def gas_group(text: str) -> int:
    """The lowest bind group (0-3) no binding of text declares, in any entry
    point; MAX_GROUPS when all four are (gas_form refuses it with a loop)."""
    values = [value for _, value, _ in tokens(text)]
    taken = {_group_at(values, i) for i in range(1, len(values)) if values[i] == "group" and values[i - 1] == "@"}
    return next((g for g in range(MAX_GROUPS) if g not in taken), MAX_GROUPS)


@lru_cache(maxsize=64)
def _gas_form(text: str, group: int | None) -> GasForm:
    toks = list(tokens(text))
    values = [value for _, value, _ in toks]
    _check_names(text, toks, values, False, group)  # every kernel: only a gas form has kem's names
    # No loop statement is inside parentheses: a loop word there names a diagnostic rule (@diagnostic(off, a.loop))
    depth = list(accumulate((v == "(") - (v == ")") for v in values))
    if depth and (min(depth) < 0 or depth[-1] != 0) and not LOOP_WORDS.isdisjoint(values):  # naga takes none
        raise KemError("bad_kernel", "unbalanced parentheses")
    loop_at = [i for i, value in enumerate(values) if value in LOOP_WORDS and depth[i] == 0]
    if not loop_at:
        return GasForm(text, False)
    if group is not None and not 0 <= group < MAX_GROUPS:
        raise _refuse(text, toks[loop_at[0]][2], f"a kernel with a loop needs a bind group for kem's gas meter; this one "
                                                 f"declares all of WebGPU's {MAX_GROUPS} (0-{MAX_GROUPS - 1}): free one")
    _check_names(text, toks, values, True, group)
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
    at = GROUP if group is None else group
    declarations = _DECLARATIONS.format(group=at, cap=CAP_BINDING, meter=METER_BINDING)
    return GasForm(_apply(text, inserts) + declarations, True, len(loop_at), uniform, at)


def metered(shape) -> bool:
    """Whether a reflected text (wgsl_reflect.KernelShape) is a metered gas form: it binds the meter."""
    return any(b.name.startswith(PREFIX) for b in shape.bindings)


def _refuse(text: str, offset: int, why: str) -> KemError:
    line, column = position(text, offset)
    return KemError("bad_kernel", f"{line}:{column}: {why}")


def _check_names(text: str, toks: list, values: list[str], groups: bool, group: int | None) -> None:
    """No token of kem's prefix; with groups, every group a literal and none
    the meter's (the execute road, group None: none but 0)."""
    for i, value in enumerate(values):
        if not groups and value.startswith(PREFIX):
            raise _refuse(text, toks[i][2], f"{value}: names starting {PREFIX} are kem's (gas metering)")
        if not groups or value != "group" or i == 0 or values[i - 1] != "@":
            continue
        declared = _group_at(values, i)
        if group is None and declared != 0:
            raise _refuse(text, toks[i][2], f"kem binds kernels at @group(0) only (the gas meter is @group({GROUP}))")
        if declared is None or declared == group:
            raise _refuse(text, toks[i][2], f"a kernel with a loop names its groups by integer literals, none of them "
                                            f"the gas meter's @group({group})")


def _group_at(values: list[str], i: int) -> int | None:
    """The literal N of the ``@group(N)`` whose ``group`` token is at i, else None."""
    if values[i + 1 : i + 2] != ["("] or values[i + 3 : i + 4] != [")"]:
        return None
    return parse_int_literal(values[i + 2])


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
        # fn NAME( only: a diagnostic rule may be named fn.a (it hid a barrier function)
        elif value == "fn" and depth == 0 and values[i + 2 : i + 3] == ["("]:
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
    return next((j for j in range(i + 1, len(values)) if values[j] in ("{", "}")), None)


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
    return bool(set(body) & (BARRIERS | barrier_fns))


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
