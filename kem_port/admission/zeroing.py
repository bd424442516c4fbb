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

Atomics cannot be assigned, so they are cleared with ``atomicStore``; a
workgroup variable of a shape the rewrite does not cover (a struct holding
atomics, arrays of arrays of atomics) makes the kernel refused as
``kernel_rejected`` on an adapter that leaks, never run uncleared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from kem_port.errors import KemError
from kem_port.gpu.wgsl_canonical import canonical, sequence_count
from kem_port.gpu.wgsl_reflect import _attributes, _parser

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_WORKGROUP_VAR = re.compile(rf"\bvar\s*<\s*workgroup\s*>\s*({IDENT})\s*:\s*([^;]+);")
_WORKGROUP_ANY = re.compile(r"\bvar\s*<\s*workgroup\b")
_ARRAY = re.compile(r"array\s*<(.*)>", re.S)
_ATOMIC = re.compile(r"atomic\s*<[^<>]*>")
INDEX = "_kem_lii"


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


def workgroup_vars(code: str) -> list[WorkgroupVar]:
    """Every module-scope ``var<workgroup>`` of canonical code; refuses
    a declaration it cannot read, rather than leave it uncleared. The
    count is checked on the WGSL lexer's tokens (``var`` ``<``
    ``workgroup``, whatever spacing), not only on this regex."""
    found = [WorkgroupVar(m.group(1), " ".join(m.group(2).split())) for m in _WORKGROUP_VAR.finditer(code)]
    declared = sequence_count(code, ("var", "<", "workgroup"))
    if len(found) != len(_WORKGROUP_ANY.findall(code)) or len(found) != declared:
        raise KemError("kernel_rejected", "a var<workgroup> declaration kem cannot clear on this adapter")
    return found


def zero_workgroup_memory(source: str) -> str:
    """source with a clearing prologue in each compute entry point; the
    source itself when it declares no workgroup variables. The result is
    built on the canonical text (what the store gives anyway): the tree
    walked here and the text naga compiles are one."""
    code = strip_comments(source)
    found = workgroup_vars(code)
    if not found:
        return source
    tree = _parser().parse(code.encode("ascii"))
    edits: list[tuple[int, str]] = []
    entries = 0
    for node in tree.root_node.children:
        if node.type == "function_declaration" and any(a == "compute" for a, _ in _attributes(node)):
            edits.extend(_entry_edits(node, code, found))
            entries += 1
    if entries != sequence_count(code, ("@", "compute")):
        # An entry point the tree did not read (an ERROR node) would run
        # with its workgroup memory uncleared: never run it.
        raise KemError("kernel_rejected", "a compute entry point kem cannot parse to clear its workgroup memory")
    # Canonical text is ASCII: tree-sitter's byte offsets are string offsets.
    for offset, text in sorted(edits, reverse=True):
        code = code[:offset] + text + code[offset:]
    return code


def _entry_edits(fn: Node, code: str, found: list[WorkgroupVar]) -> list[tuple[int, str]]:
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
    stride = _stride(fn)
    lines = [_clear(var, index, stride, code) for var in found]
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


def _stride(fn: Node) -> str:
    """The workgroup's invocation count as a WGSL expression (any value
    from 1 to the true count is correct, only slower)."""
    for attr, args in _attributes(fn):
        if attr == "workgroup_size" and args:
            return " * ".join(f"u32({a.text.decode()})" for a in args)
    return "1u"


def _clear(var: WorkgroupVar, index: str, stride: str, code: str) -> str:
    kind, element, count = _shape(var.type_text, code)
    if kind == "plain":
        return f"if ({index} == 0u) {{ {var.name} = {var.type_text}(); }}"
    if kind == "atomic":
        return f"if ({index} == 0u) {{ atomicStore(&{var.name}, 0); }}"
    loop = f"for (var _kem_i: u32 = {index}; _kem_i < u32({count}); _kem_i += {stride})"
    if kind == "array":
        return f"{loop} {{ {var.name}[_kem_i] = {element}(); }}"
    return f"{loop} {{ atomicStore(&{var.name}[_kem_i], 0); }}"


def _shape(type_text: str, code: str) -> tuple[str, str, str]:
    """("plain" | "atomic" | "array" | "atomic_array", element, count)."""
    array = _ARRAY.fullmatch(type_text)
    if array is not None:
        element, count = _split_last_arg(array.group(1))
        if count and not _holds_atomic(element, code):
            return "array", element, count
        if count and _ATOMIC.fullmatch(element):
            return "atomic_array", element, count
    elif _ATOMIC.fullmatch(type_text):
        return "atomic", type_text, ""
    elif not _holds_atomic(type_text, code):
        return "plain", type_text, ""
    raise KemError("kernel_rejected", f"workgroup variable {var_label(type_text)} cannot be cleared on this adapter")


def var_label(type_text: str) -> str:
    return type_text[:60]


def _split_last_arg(args: str) -> tuple[str, str]:
    depth = 0
    for i in range(len(args) - 1, -1, -1):
        ch = args[i]
        if ch in ">)":
            depth += 1
        elif ch in "<(":
            depth -= 1
        elif ch == "," and depth == 0:
            return args[:i].strip(), args[i + 1 :].strip()
    return args.strip(), ""


_TYPE_DECL = re.compile(rf"\b(?:struct\s+({IDENT})\s*\{{([^}}]*)\}}|alias\s+({IDENT})\s*=([^;]*);)")


def _holds_atomic(type_text: str, code: str) -> bool:
    """Whether a type, through the structs and aliases it names, holds an
    atomic. Each declaration is read once and each name visited once: a
    recursive walk that re-searched the code for every path was
    exponential in a ladder of structs naming the one below twice (14
    levels: 1.1 s, doubling each level) and hit Python's recursion limit
    at ~1,000 aliases (red team, issue 24)."""
    bodies: dict[str, str] = {}
    for decl in _TYPE_DECL.finditer(code):
        bodies.setdefault(decl.group(1) or decl.group(3), decl.group(2) if decl.group(1) else decl.group(4))
    seen: set[str] = set()
    pending = [type_text]
    while pending:
        text = pending.pop()
        if "atomic" in text:
            return True
        for name in set(re.findall(IDENT, text)) - seen:
            seen.add(name)
            if name in bodies:
                pending.append(bodies[name])
    return False
