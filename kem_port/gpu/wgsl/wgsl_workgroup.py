"""A kernel's ``var<workgroup>`` declarations and the initializers their
sizes may name, read for gpu/constants.py, which holds an override-sized
workgroup array to the bound admission/limits.py holds literal sizes to
(issue 25, red team F2). Read on the WGSL lexer's canonical text
(gpu/wgsl/wgsl_canonical.py), as admission/zeroing.py reads the same
declarations: tree-sitter's grammar fails on a size like ``N * 2u``.
"""

from __future__ import annotations

import re

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import canonical, tokens

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_NAME = re.compile(_IDENT)
_STRUCT = re.compile(rf"\bstruct\s+({_IDENT})\s*\{{([^{{}}]*)\}}")
_ELEMENT = re.compile(r"array\s*<(.*)>", re.S)
MAX_ALIAS_STEPS = 16  # real kernels alias a type once or twice; a longer chain is left unread
# Characters of type text the const replacement may write in all, per
# kernel: a stranger's 35,000 workgroup variables each naming a chain of
# consts would otherwise cost 16 passes over 4 KB each (minutes); past it,
# counts are left unread (the compile worker's limits, as before).
MAX_REPLACED_CHARS = 1 << 20
MAX_STRUCT_CHARS = 4096  # a struct's element count as text: members' counts summed (memoised, so a struct is written once)
UNREAD = "array<u32, ?>"  # a count constants.py cannot read


def workgroup_vars(source: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """Module-scope var<workgroup> declarations read on the canonical text
    (comments blanked), as admission/zeroing.py reads them: tree-sitter's
    grammar fails on a size like ``N * 2u``. An alias is followed up to
    MAX_ALIAS_STEPS (a stranger's 50,000 chained aliases and as many
    variables must not cost their product). What is not read here (text
    the lexer refuses, a longer chain) is left to the compile worker's
    resource limits, as before. A ``const``'s name in a type is replaced
    by its initializer (consts never name overrides), up to as many steps;
    overrides' initializers are returned for gpu/constants.py to evaluate
    with the call's values."""
    try:
        code = canonical(source)
        found_decls = _declarations(code)
    except KemError:
        return (), ()
    elements = _Elements(found_decls["alias"], {m.group(1): _members(m.group(2)) for m in _STRUCT.finditer(code)})
    found, replaced, budget = [], {}, [MAX_REPLACED_CHARS]
    for name, type_text in found_decls["workgroup"].items():
        text = elements.type_text(type_text)
        if text not in replaced:
            replaced[text] = _replace_consts(text, found_decls["const"], budget)
        found.append((name, replaced[text]))
    return tuple(found), tuple(found_decls["override"].items())


def _declarations(code: str) -> dict[str, dict[str, str]]:
    """In one pass over the tokens, each statement read once: every
    ``var<workgroup> NAME: TYPE`` (TYPE), ``alias NAME = TYPE``, ``const``
    and ``override`` ``NAME [: T] = INIT`` (INIT) outside braces (WGSL's
    module scope has no order: a function's own const N may come first and
    is not the N a type names), texts with blanks
    made single spaces. Regexes over the text did this before, and each
    declaration without its ';' rescanned the rest of the kernel: 20,000
    lines of ``var<workgroup>a:`` (340 KB) took 40 s (red team of wave 3)."""
    toks = list(tokens(code))
    values = [value for _, value, _ in toks]
    found: dict[str, dict[str, str]] = {"workgroup": {}, "alias": {}, "const": {}, "override": {}}
    i, n, depth = 0, len(values), 0
    while i < n:
        value, start, kind = values[i], i + 2, ""
        # Inside braces (a function) nothing is module scope: a function's
        # const N = 2 written before the module's const N = 16384 sized
        # array<f32, N> as 4 bytes, not 65,536 (red team 9).
        if depth == 0 and value == "var" and values[i + 1 : i + 4] == ["<", "workgroup", ">"]:
            kind, start = "workgroup", i + 4
        elif depth == 0 and value in ("alias", "const", "override"):
            kind, start = value, i + 1
        if not kind:
            depth += (value == "{") - (value == "}")
            i += 1
            continue
        end = start
        while end < n and values[end] != ";":
            end += 1
        i = end + 1  # the statement is read once, whatever it holds
        body = values[start:end]
        if len(body) < 3 or not (body[0][0].isalpha() or body[0][0] == "_"):
            continue
        split = ":" if kind == "workgroup" else "="
        if body[1] != split and not (kind in ("const", "override") and body[1] == ":" and "=" in body):
            continue
        at = start + body.index(split) + 1
        if at < end:
            text = " ".join(code[toks[at][2] : toks[end - 1][2] + len(values[end - 1])].split())
            found[kind].setdefault(body[0], text)
    return found


def workgroup_templates(values: list[str]) -> int:
    """How many ``var`` templates of the lexed values name the workgroup
    address space in any form naga reads: ``var<workgroup>``, and also
    ``var<(workgroup)>`` and ``var<workgroup,>``, which it accepts too
    (red team 9: the first was neither counted nor cleared). Callers
    compare this with the declarations they read and refuse a difference."""
    count, n = 0, len(values)
    for i in range(n - 1):
        if values[i] == "var" and values[i + 1] == "<":
            j = i + 2
            while j < n and values[j] == "(":  # each run of '(' follows one var: linear
                j += 1
            count += j < n and values[j] == "workgroup"
    return count


def _replace_consts(text: str, consts: dict[str, str], budget: list[int]) -> str:
    """text with each const's name replaced by its initializer, within the budget."""
    for _ in range(MAX_ALIAS_STEPS):
        if budget[0] < len(text) or not any(n in consts for n in _NAME.findall(text)):
            break
        budget[0] -= len(text)
        text = _NAME.sub(lambda n: f"({consts[n.group(0)]})" if n.group(0) in consts else n.group(0), text)
    return text



def module_consts(source: str) -> tuple[tuple[str, str], ...]:
    """(name, initializer text) of each module-scope const (outside braces,
    whatever functions declare before it); () for text
    the lexer refuses."""
    try:
        return tuple(_declarations(canonical(source))["const"].items())
    except KemError:
        return ()


def _followed(text: str, aliases: dict[str, str]) -> str:
    """text with aliases followed, UNREAD past MAX_ALIAS_STEPS of them."""
    for _ in range(MAX_ALIAS_STEPS):
        if text not in aliases:
            return text
        text = aliases[text]
    return UNREAD if text in aliases else text


def _members(body: str) -> tuple[str, ...]:
    """The type text of each member of a struct body (``@size(64) a:
    array<f32, 4>, b: u32``), split at top-level commas."""
    return tuple(type_text for _, type_text in _struct_members(body))


class _Elements:
    """A type's text with every element type (after aliases) that is an
    array or a struct written out, so that constants.py counts elements,
    not outer entries: ``array<Row, N>`` with ``alias Row = array<f32,
    4096>`` counted N (N = 4,096 ran 16M elements, 64 MiB, on lavapipe:
    red team of wave 3), and a struct counts as an array of its members'
    elements: ``struct S { a: array<f32, 4096>, b: u32 }`` is
    ``array<u32, ((4096)) + (1)>``. What it cannot write out (nesting past
    MAX_ALIAS_STEPS, a struct's count over MAX_STRUCT_CHARS) becomes a
    count no one reads, which constants.py refuses where an override sizes
    the variable."""

    def __init__(self, aliases: dict[str, str], structs: dict[str, tuple[str, ...]]) -> None:
        self.aliases, self.structs = aliases, structs
        self.done: dict[str, str] = {}  # each struct's count, once

    def type_text(self, text: str, steps: int = MAX_ALIAS_STEPS) -> str:
        text = _followed(text, self.aliases)
        if steps <= 0:
            return UNREAD
        split = _split_array(text)
        if split is not None:
            return f"array<{self.type_text(split[0], steps - 1)}, {split[1]}>"
        if text not in self.structs:
            return text  # a scalar, vector, matrix or atomic: one element
        if text not in self.done:
            self.done[text] = UNREAD  # a struct cannot hold itself; a cycle is naga's to refuse
            parts = [_product(self.type_text(m, steps - 1)) for m in self.structs[text]]
            count = " + ".join(f"({p})" for p in parts) or "1"
            self.done[text] = UNREAD if len(count) > MAX_STRUCT_CHARS else f"array<u32, {count}>"
        return self.done[text]


def _split_array(text: str) -> tuple[str, str] | None:
    """(element type, count) of an ``array<T, C>`` text; None for any other."""
    array = _ELEMENT.fullmatch(text)
    if array is None:
        return None
    args, depth = array.group(1), 0
    for i in range(len(args) - 1, -1, -1):  # the count is the last top-level argument
        depth += (args[i] in ">)") - (args[i] in "<(")
        if args[i] == "," and depth == 0:
            return args[:i].strip(), args[i + 1 :].strip()
    return None  # runtime-sized


def _product(text: str) -> str:
    """A written-out type's element count as an expression: its counts multiplied."""
    counts = []
    while (split := _split_array(text)) is not None:
        text = split[0]
        counts.append(f"({split[1]})")
    return " * ".join(counts) or "1"


def _struct_members(body: str) -> tuple[tuple[str, str], ...]:
    """(attributes, type text) of each member of a struct body."""
    members, depth, start = [], 0, 0
    for i, char in enumerate(body + ","):
        depth += (char in "<(") - (char in ">)")
        if char == "," and depth == 0:
            member = body[start:i]
            if ":" in member:
                head, type_text = member.split(":", 1)
                members.append((head, " ".join(type_text.split())))
            start = i + 1
    return tuple(members)
