"""Clear workgroup memory before a kernel's body runs.

WGSL promises zero-initialised workgroup variables, but lavapipe keeps
them in memory its worker threads reuse: a kernel that declares a
``var<workgroup>`` array and never writes it read back another caller's
input verbatim (issue 13). wgpu-native 0.32 offers no switch for naga's
zero-initialisation polyfill (``wgpuDeviceCreateShaderModuleTrusted``'s
runtime checks cover bounds and loops only), so kem rewrites the source:
each compute entry point starts with a loop that zeroes every workgroup
variable, strided by ``local_invocation_index`` over the workgroup, then a
``workgroupBarrier()``. The rewrite is textual and small; the sacrificial
compile (admission/guard.py) checks that the result compiles. It works on
the kernel's canonical text (gpu/wgsl_canonical.py: comments and exotic
blankspace gone, so a declaration cannot hide from it while naga compiles
it), and the declarations it clears must number exactly the
``var<workgroup>`` the WGSL lexer counts, and the entry points it edits
the ``@compute`` ones, else the kernel is refused (issue 24).

Atomics cannot be assigned, so they are cleared with ``atomicStore``, and
a struct or nested array holding them part by part (admission/
zeroing_types.py); a variable of a shape the rewrite cannot read, or one
needing over 256 statements, makes the kernel refused as
``kernel_rejected`` on an adapter that leaks, never run uncleared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_calls import names_reached
from kem_port.gpu.wgsl.wgsl_canonical import canonical, names_declared_in, sequence_in, token_values
from kem_port.gpu.wgsl.wgsl_gas import gas_form
from kem_port.gpu.wgsl.wgsl_workgroup import workgroup_templates
from kem_port.gpu.wgsl.wgsl_reflect import _attributes, _parser
from kem_port.admission.zeroing_types import ARRAY, ATOMIC, IDENT, Types, cannot_clear, clear_parts, split_last_arg

_WORKGROUP_VAR = re.compile(rf"\bvar\s*<\s*workgroup\s*>\s*({IDENT})\s*:\s*([^;]+);")
_WORKGROUP_ANY = re.compile(r"\bvar\s*<\s*workgroup\b")
INDEX = "_kem_lii"
# Predeclared functions the clearing prologue calls.
CLEARING_CALLS = frozenset({"workgroupBarrier", "atomicStore"})


@dataclass(frozen=True)
class WorkgroupVar:
    name: str
    type_text: str


def strip_comments(source: str) -> str:
    """source's canonical text (gpu/wgsl_canonical.py): comments blanked
    as the WGSL spec reads them (every line break ends a line comment;
    block comments nest), offsets kept; bad_kernel for text the lexer
    cannot account for."""
    return canonical(source)


def workgroup_vars(code: str, values: list[str]) -> list[WorkgroupVar]:
    """Every module-scope ``var<workgroup>`` of canonical code; refuses
    a declaration it cannot read, rather than leave it uncleared. The
    count is checked on the WGSL lexer's tokens (``var`` ``<``
    ``workgroup``, whatever spacing), not only on this regex."""
    # Searched up to the last ';': a declaration with no ';' after it rescanned the rest
    # of the kernel, 20,000 lines of var<workgroup>a: (340 KB) took 42 s (red team of
    # wave 3); with a ';' ahead every match ends at the next one. Those past it are
    # unmatched, counted below, and refused as before.
    searched = code[: code.rfind(";") + 1]
    found = [WorkgroupVar(m.group(1), " ".join(m.group(2).split())) for m in _WORKGROUP_VAR.finditer(searched)]
    declared = workgroup_templates(values)  # var<(workgroup)> too, which naga takes (red team 9)
    if len(found) != len(_WORKGROUP_ANY.findall(code)) or len(found) != declared:
        raise KemError("kernel_rejected", "a var<workgroup> declaration kem cannot clear on this adapter")
    return found


def zero_workgroup_memory(source: str) -> str:
    """source with a clearing prologue in each compute entry point; the
    source itself when it declares no workgroup variables. The result is
    built on the canonical text (what the store gives anyway): the tree
    walked here and the text naga compiles are one."""
    code = strip_comments(source)
    values = token_values(code)  # lexed once for the three token checks below
    found = workgroup_vars(code, values)
    if not found:
        return source
    shadowed = names_declared_in(values) & CLEARING_CALLS
    if shadowed:
        # WGSL lets a kernel declare its own workgroupBarrier or atomicStore
        # (naga follows): the prologue would call a no-op and leave the
        # memory uncleared for the other invocations (red team: the
        # previous caller's secret read back on lavapipe).
        raise KemError("kernel_rejected", f"a kernel that declares its own {', '.join(sorted(shadowed))} cannot have its workgroup memory cleared")
    tree = _parser().parse(code.encode("ascii"))
    reached = names_reached(values, frozenset(var.name for var in found))  # per entry point, one pass
    types = Types(code)  # once: built per entry point, 800 entries took 5.1 s
    edits: list[tuple[int, str]] = []
    entries = 0
    for node in tree.root_node.children:
        if node.type == "function_declaration" and any(a == "compute" for a, _ in _attributes(node)):
            # Only what the entry point can name: clearing every variable in
            # every entry made each entry use them all, and a module of two
            # entries with 24 KiB each asked 48 KiB of each workgroup
            # (gpu/workgroup_limits.py holds the compiled text to the limit).
            name = next((c.text.decode() for c in node.children if c.type == "identifier"), None)
            used = reached.get(name) if name is not None else None
            mine = [var for var in found if used is None or var.name in used]
            if mine:
                edits.extend(_entry_edits(node, code, mine, types))
            entries += 1
    if entries != sequence_in(values, ("@", "compute")):
        # An entry point the tree did not read (an ERROR node) would run
        # with its workgroup memory uncleared: never run it.
        raise KemError("kernel_rejected", "a compute entry point kem cannot parse to clear its workgroup memory")
    # Canonical text is ASCII: tree-sitter's byte offsets are string offsets.
    for offset, text in sorted(edits, reverse=True):
        code = code[:offset] + text + code[offset:]
    return code


def _entry_edits(fn: Node, code: str, found: list[WorkgroupVar], types: Types) -> list[tuple[int, str]]:
    body = next((c for c in fn.children if c.type == "compound_statement"), None)
    open_paren = next((c for c in fn.children if c.type == "("), None)
    if body is None or open_paren is None or code[body.start_byte : body.start_byte + 1] != "{":
        raise KemError("kernel_rejected", "an entry point kem cannot parse to clear its workgroup memory")
    edits = []
    index = _index_expression(fn, code)
    if index is None:
        params = next((c for c in fn.children if c.type == "parameter_list"), None)
        edits.append((open_paren.end_byte, f"@builtin(local_invocation_index) {INDEX}: u32" + (", " if params else "")))
        index = INDEX
    stride = _stride(fn, code)
    lines = [_clear(var, index, stride, types) for var in found]
    edits.append((body.start_byte + 1, "\n    " + "\n    ".join(lines) + "\n    workgroupBarrier();\n"))
    return edits


def _index_expression(fn: Node, code: str) -> str | None:
    """How the entry point already names local_invocation_index: a
    parameter, or a member of a struct parameter; None when it does not."""
    for child in fn.children:
        if child.type != "parameter_list":
            continue
        for param in child.children:
            if param.type != "parameter":
                continue
            ident = _param_ident(param)
            if any(a == "builtin" and args and args[0].text == b"local_invocation_index" for a, args in _attributes(param)):
                return ident
            member = _struct_member_index(_param_type(param), code)
            if member is not None and ident is not None:
                return f"{ident}.{member}"
    return None


def _param_ident(param: Node) -> str | None:
    for sub in param.children:
        if sub.type == "variable_identifier_declaration" and sub.child(0) is not None:
            return sub.child(0).text.decode()
    return None


def _param_type(param: Node) -> str:
    for sub in param.children:
        if sub.type == "variable_identifier_declaration":
            for part in sub.children:
                if part.type == "type_declaration":
                    return part.text.decode()
    return ""


def _struct_member_index(type_name: str, code: str) -> str | None:
    if not re.fullmatch(IDENT, type_name):
        return None
    struct = re.search(rf"\bstruct\s+{type_name}\s*\{{([^}}]*)\}}", code)
    if struct is None:
        return None
    member = re.search(rf"@builtin\s*\(\s*local_invocation_index\s*\)\s*({IDENT})\s*:", struct.group(1))
    return member.group(1) if member else None


def _stride(fn: Node, code: str) -> str:
    """The workgroup's invocation count as a WGSL expression (any value
    from 1 to the true count is correct, only slower). Read off the
    attribute's text, not its parse: tree-sitter's grammar splits an
    expression argument such as ``BLOCK / 2`` into an ERROR node and its
    tokens, and a stride built from those ("u32(/ 2)") did not compile
    (a real prefix-sum kernel, compatibility sweep)."""
    for attr in fn.children:
        if attr.type == "attribute" and any(p.type == "identifier" and p.text == b"workgroup_size" for p in attr.children):
            args = _attribute_args(code[attr.start_byte : attr.end_byte])
            return " * ".join(f"u32({a})" for a in args) if args else "1u"
    return "1u"


def _attribute_args(text: str) -> list[str] | None:
    """The 1-3 arguments of ``@workgroup_size(...)``, split at top-level
    commas; None when unsure (a template's comma: '<' may also compare)."""
    open_at = text.find("(")
    if open_at < 0 or not text.endswith(")"):
        return None
    args, depth, part = [], 0, ""
    for ch in text[open_at + 1 : -1]:
        depth += (ch in "([") - (ch in ")]")
        if depth < 0 or ch in "<>":
            return None
        if ch == "," and depth == 0:
            args.append(part.strip())
            part = ""
        else:
            part += ch
    args.append(part.strip())
    if args and not args[-1] and len(args) > 1:
        args.pop()  # a trailing comma
    return args if 1 <= len(args) <= 3 and all(args) and depth == 0 else None


def _clear(var: WorkgroupVar, index: str, stride: str, types: Types) -> str:
    kind, element, count = _shape(var.type_text, types)
    if kind == "plain":
        return f"if ({index} == 0u) {{ {var.name} = {var.type_text}(); }}"
    if kind == "atomic":
        return f"if ({index} == 0u) {{ atomicStore(&{var.name}, 0); }}"
    if kind == "composite":
        return f"if ({index} == 0u) {{ {' '.join(clear_parts(var.name, var.type_text, types, 0, [0]))} }}"
    loop = f"for (var _kem_i: u32 = {index}; _kem_i < u32({count}); _kem_i += {stride})"
    if kind == "array":
        return f"{loop} {{ {var.name}[_kem_i] = {element}(); }}"
    return f"{loop} {{ {' '.join(clear_parts(f'{var.name}[_kem_i]', element, types, 0, [0]))} }}"


def _shape(type_text: str, types: Types) -> tuple[str, str, str]:
    """("plain" | "atomic" | "array" | "composite" | "composite_array",
    element, count): a composite holds atomics in a struct or a nested
    array and is cleared part by part (zeroing_types.clear_parts). An
    alias is followed first: an array sized by an override constant is not
    constructible, so ``W = Alias()`` failed to compile; it is cleared
    element by element like the array it names."""
    type_text = types.resolve(type_text)
    array = ARRAY.fullmatch(type_text)
    if array is not None:
        element, count = split_last_arg(array.group(1))
        if count and not types.holds_atomic(element):
            return "array", element, count
        if count:
            return "composite_array", element, count
    elif ATOMIC.fullmatch(type_text):
        return "atomic", type_text, ""
    elif not types.holds_atomic(type_text):
        return "plain", type_text, ""
    else:
        return "composite", type_text, ""
    raise cannot_clear(type_text)


def compiled_text(text: str, clear: bool, metered: bool) -> str:
    """What the port compiles of a kernel: its gas form when metered (every
    loop counted, gpu/wgsl/wgsl_gas.py; named runs', sessions' and chains'
    forms come in already made at their gas group, docs/metering.md), then
    the clearing when asked (kem's own bounded loop, added after the count
    is placed: uncounted, so gas does not depend on the adapter)."""
    own = gas_form(text).text if metered else text
    return zero_workgroup_memory(own) if clear else own
