"""Where a kernel uses its two bindings, and each use redirected into a
call's slot (the half of gpu/slot_kernel.py's rewrite that reads the parse
tree): ``input[e]`` becomes ``kem_in_at(u32(e))``, ``output[e]`` written
(or its address taken for an atomic) indexes ``output[kem_out(u32(e))]``,
``arrayLength(&x)`` the call's own length; a kernel that reads its output
is refused.
Anything else refuses the rewrite, and so does a use the WGSL lexer finds
that the walk did not handle (the grammar reads some valid WGSL as ERROR).
Everything here reads the kernel's canonical text (gpu/wgsl_canonical.py):
no comments, so no text for the tree and naga to disagree on.
"""

from __future__ import annotations

import re

from tree_sitter import Node

from kem_port.gpu.wgsl.wgsl_reflect import _walk as walk


# WGSL's atomic builtins, the only calls _atomic_statement trusts: a kernel's
# own fn atomicPeek(p: ptr<storage, atomic<u32>, read_write>) would read the
# spare element (naga of wgpu-py 0.32 refuses storage pointer parameters;
# the unrestricted_pointer_parameters extension would allow them). A kernel
# that declares one of these names keeps one dispatch per call (slot_kernel).
ATOMIC_BUILTINS = ("atomicLoad", "atomicStore", "atomicAdd", "atomicSub", "atomicMax", "atomicMin", "atomicAnd",
                   "atomicOr", "atomicXor", "atomicExchange", "atomicCompareExchangeWeak")


class Refused(Exception):
    """The kernel is not rewritten; the message says why (logged at debug)."""


class Edits:
    """Non-overlapping (start, end, text) replacements on the source bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.spans: list[tuple[int, int, bytes]] = []

    def replace(self, start: int, end: int, text: str) -> None:
        self.spans.append((start, end, text.encode("utf-8")))

    def apply(self) -> bytes:
        out, at = [], 0
        for start, end, text in sorted(self.spans, key=lambda s: (s[0], s[1])):
            if start < at:
                raise Refused("overlapping rewrites")
            out += [self.data[at:start], text]
            at = end
        return b"".join(out + [self.data[at:]])


def element_type(code: bytes, name: str) -> str:
    """T of ``var<storage, ...> name: array<T>`` (runtime-sized), as text
    without spaces; read from the text, since the grammar does not read
    every element type (atomic<u32>)."""
    found = declaration(code, name)
    if found is None:
        raise Refused(f"binding {name} is not a runtime-sized array")
    depth, at = 1, found.end()
    while at < len(code) and depth:
        depth += {60: 1, 62: -1}.get(code[at], 0)  # '<' and '>'
        at += 1
    inner = b"".join(code[found.end() : at - 1].split()).decode()
    if depth or not inner or _top_level_comma(inner):
        raise Refused(f"binding {name} is not a runtime-sized array")
    return inner


def declaration(code: bytes, name: str) -> re.Match | None:
    """Where ``name: array<`` is written (the binding's declaration)."""
    return re.search(rb"(?<![A-Za-z0-9_])" + re.escape(name.encode()) + rb"\s*:\s*array\s*<", code)


def _top_level_comma(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            return True
    return False


def redirect_uses(root: Node, name: str, is_input: bool, declared_at: int, edits: Edits, element: str = "u32") -> int:
    """Redirect every use of binding `name` into the slot; return how many.
    `element`: this binding's element type (vectors: _component_read,
    _component_written; atomics: _atomic_statement)."""
    vector, atomic = element.startswith("vec"), element.startswith("atomic")
    handled = 0
    for node in walk(root):
        if node.type != "identifier" or node.text.decode() != name or node.start_byte == declared_at:
            continue
        handled += 1
        if _array_length_call(node):
            call = node.parent.parent.parent
            edits.replace(call.start_byte, call.end_byte, "kem_slots.x" if is_input else "kem_slots.z")
            continue
        brackets = _brackets_after(node)
        if brackets is None:
            raise Refused(f"{node.text.decode()} is used other than through [...] or arrayLength")
        open_, close = brackets
        if is_input:
            if _address_taken(node):
                raise Refused("the input's address is taken")
            if vector and _component_read(edits.data, close.end_byte):
                raise Refused("a component of a vector binding is read by index")
            edits.replace(node.start_byte, open_.end_byte, "kem_in_at(u32(")
            edits.replace(close.start_byte, close.end_byte, "))")
        elif node.parent.type == "subscript_expression" and not _address_taken(node):
            # Past the output no answer matches a lone call's: there a read
            # after a barrier is zero (red team 6: the spare element gave
            # the call's stray write back), but one after the same
            # invocation's own write gets that write, forwarded by the
            # compiler (lavapipe; red team 8: a getter's zero differed).
            raise Refused("the output is read")
        else:
            if vector and _component_written(edits.data, node.start_byte, close.end_byte):
                raise Refused("a component of an output vector is written by index")
            if atomic and not _atomic_statement(edits.data, node.start_byte):
                raise Refused("an atomic's result on the output is used")
            if not atomic and _address_taken(node):
                # A pointer past the output reaches the spare element, and
                # a read through it the call's own stray write, where a
                # lone call reads zero (red team 7: let p = &(dst[n + 3u])).
                raise Refused("the output's address is taken other than for an atomic")
            if not atomic and not _assigned(edits.data, node.start_byte, close.end_byte):
                # The grammar reads a call statement's argument as an
                # assignment's left side: peek(dst[n + 3u], 0u) took the
                # write form and read the spare element, the call's own
                # stray write, where alone it reads zero (red team 8).
                raise Refused("an output element is used where this rewrite cannot tell a read from a write")
            edits.replace(open_.end_byte, open_.end_byte, "kem_out(u32(")
            edits.replace(close.start_byte, close.start_byte, "))")
    return handled


def _array_length_call(ident: Node) -> bool:
    """``arrayLength(&ident)`` exactly."""
    unary, args = ident.parent, ident.parent.parent
    if unary.type != "unary_expression" or unary.child_count != 2 or unary.child(0).type != "&":
        return False
    if args is None or args.type != "argument_list_expression" or args.named_child_count != 1:
        return False
    call = args.parent
    return call is not None and call.type == "type_constructor_or_function_call_expression" and call.child(0).text == b"arrayLength"


def _brackets_after(ident: Node) -> tuple[Node, Node] | None:
    """The '[' and its ']' that index ``ident`` directly (``ident[e]``), as
    an expression (subscript_expression) or an assignment's left side
    (lhs_expression + postfix_expression)."""
    parent = ident.parent
    if parent.type == "subscript_expression" and parent.child(0) == ident:
        kids = parent.children
        if len(kids) == 4 and kids[1].type == "[" and kids[3].type == "]":
            return kids[1], kids[3]
        return None
    sibling = ident.next_sibling
    if parent.type == "lhs_expression" and sibling is not None and sibling.type == "postfix_expression":
        kids = sibling.children
        if len(kids) >= 3 and kids[0].type == "[" and kids[2].type == "]":
            return kids[0], kids[2]
    return None


def _address_taken(ident: Node) -> bool:
    node = ident.parent
    while node is not None and node.type in ("subscript_expression", "composite_value_decomposition_expression", "parenthesized_expression"):
        node = node.parent
    return node is not None and node.type == "unary_expression" and node.child(0).type == "&"


def _component_written(data: bytes, start: int, end: int) -> bool:
    """Whether the output element ``data[start:end]`` (``name[e]``, written
    or its address taken) may have a component written by a runtime index:
    followed by ``[`` or inside parentheses, a pointer or ``*``. A vector's
    component index into a storage buffer is bounded only by robust access
    to the binding, the group's whole buffer here: ``output[e][j]`` with
    j past 3 on a slot's spare element wrote into the next slot, another
    caller's output (red team 6). A lone call is bound to its own range,
    where such a write stays or is dropped; ``.x`` is checked statically."""
    before = data[:start].rstrip()[-1:]
    after = data[end:].lstrip()[:1]
    return after == b"[" or before in (b"(", b"&", b"*")


def _component_read(data: bytes, end: int) -> bool:
    """Whether the element read that ends at ``end`` (``name[e]``, maybe
    in parentheses) is indexed by component: ``name[e][j]``. A lone call
    reads through its binding, where j past 3 reads the next element's
    components (or zero past the binding); the slot form's getter returns
    a value, whose index naga clamps to 3: grouped and lone results
    differed (red team 7: src[i][4 + k] read src[i + 1][k] alone and
    src[i].w grouped)."""
    return data[end:].lstrip(b" \t\r\n)")[:1] == b"["


def _atomic_statement(data: bytes, start: int) -> bool:
    """Whether the output element at ``start`` is the first argument of an
    atomic called as a statement (``atomicAdd(&output[e], v);``), its
    result dropped. Past the call's output the atomic works on the slot's
    spare element, where the call's own stray atomics add up: a used
    result read their sum where a lone call reads zero (red team 6)."""
    head = data[:start].rstrip()
    if not head.endswith(b"&"):
        return False
    head = head[:-1].rstrip()
    call = re.search(rb"(?<![A-Za-z0-9_])(" + "|".join(ATOMIC_BUILTINS).encode() + rb")\s*\($", head)
    if call is None or data[: call.start()].rstrip()[-1:] not in (b";", b"{", b"}"):
        return False
    depth, at = 1, len(head)
    while at < len(data) and depth:
        depth += {40: 1, 41: -1}.get(data[at], 0)  # '(' and ')'
        at += 1
    return depth == 0 and data[at:].lstrip()[:1] == b";"


# After an element written: its component (.x), the parentheses that close
# around it, then an assignment operator or ++ / -- (not == <= >= !=).
_ASSIGNED_AFTER = re.compile(rb"[\s)]*(\.[A-Za-z_][A-Za-z0-9_]*[\s)]*)?(=(?!=)|<<=|>>=|[-+*/%&|^]=|\+\+|--)")


def _assigned(data: bytes, start: int, end: int) -> bool:
    """Whether the output element ``data[start:end]`` is written as the text
    says: it starts a statement (after ``;``, ``{`` or ``}``, maybe inside
    parentheses) and an assignment operator follows it. The parse tree is
    not enough: tree-sitter-wgsl-bevy reads ``f(dst[e], 0u);`` as ERROR
    around an assignment's left side, and a read there took the write form."""
    head = data[:start].rstrip(b" \n(")
    return head[-1:] in (b";", b"{", b"}") and _ASSIGNED_AFTER.match(data, end) is not None
