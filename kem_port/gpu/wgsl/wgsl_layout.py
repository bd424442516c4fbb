"""How many bytes a uniform's type occupies, and a storage array's element
stride, by WGSL's memory layout rules.

A kernel's params are bound as a uniform that kem pads with zeros, so a
caller who sends 8 bytes to a kernel reading a 16-byte struct used to get
silent zeros for the missing fields (the original panicked instead). With
the type's size known, too few params is a clear ``bad_args``.

Only what the size needs is computed: scalars, vectors, matrices,
fixed-size arrays and structs (WGSL spec, "Memory Layout": alignment and
size of host-shareable types, with the uniform address space's 16-byte
rounding of array strides and struct members; a storage buffer's array
element keeps its own stride: ``roundUp(AlignOf(E), SizeOf(E))``, which is
what kem's 1-D dispatch rule counts output elements by: 2 bytes an
``f16``, 16 a ``vec4<f32>`` or a ``vec3<f32>``). Anything else (aliases,
``@size``/``@align`` attributes, override-sized arrays) gives None: kem
then does not check, and naga still validates the shader.
"""

from __future__ import annotations

import re

from tree_sitter import Node

Layout = tuple[int, int]  # (align, size) in bytes

_SCALARS = {"f32": 4, "i32": 4, "u32": 4, "f16": 2}
_SHORT_VEC = re.compile(r"^vec([234])([fiuh])$")
_SHORT_MAT = re.compile(r"^mat([234])x([234])([fh])$")
_SUFFIX = {"f": 4, "i": 4, "u": 4, "h": 2}


def _round(n: int, a: int) -> int:
    return -(-n // a) * a


def _vector(count: int, scalar: int) -> Layout:
    return (scalar * (2 if count == 2 else 4), scalar * count)


def _matrix(cols: int, rows: int, scalar: int) -> Layout:
    align, size = _vector(rows, scalar)
    return align, cols * _round(size, align)


def _uniform_array(element: Layout, count: int) -> Layout:
    align, size = element
    stride = _round(_round(size, align), 16)
    return _round(align, 16), count * stride


class UniformSizes:
    """Sizes of the types declared in one WGSL source's syntax tree, by the
    uniform address space's rules (or, ``uniform=False``, storage's)."""

    def __init__(self, root: Node, uniform: bool = True) -> None:
        self._structs = {
            _name(node): node for node in root.children if node.type == "struct_declaration" and _name(node)
        }
        self._uniform = uniform
        self._done: dict[str, Layout | None] = {}

    def size_of(self, type_node: Node | None) -> int | None:
        layout = self._layout(type_node, depth=0)
        return None if layout is None else layout[1]

    def element_stride(self, type_node: Node | None) -> int | None:
        """The stride of an ``array<E>`` or ``array<E, N>`` type's elements; None for anything else."""
        if type_node is None or not type_node.children or type_node.children[0].text.decode() != "array":
            return None
        inner = [c for c in type_node.children if c.is_named and c.type == "type_declaration"]
        element = self._layout(inner[0], depth=1) if len(inner) == 1 else None
        return None if element is None else _round(element[1], element[0])

    def members(self, type_node: Node | None) -> tuple[tuple[str, str], ...]:
        """A struct type's members as (name, type text), in order; () for anything else."""
        if type_node is None or not self._is_struct(type_node):
            return ()
        struct = self._structs[type_node.children[0].text.decode()]
        found = []
        for member in (c for c in struct.children if c.type == "struct_member"):
            decl = next((c for c in member.children if c.type == "variable_identifier_declaration"), None)
            if decl is None or decl.child(0) is None:
                return ()
            type_decl = next((c for c in decl.children if c.type == "type_declaration"), None)
            found.append((decl.child(0).text.decode(), type_decl.text.decode() if type_decl is not None else ""))
        return tuple(found)

    def _layout(self, node: Node | None, depth: int) -> Layout | None:
        if node is None or depth > 32:
            return None
        parts = [c for c in node.children if c.is_named]
        head = node.children[0].text.decode() if node.children else ""
        if head in _SCALARS and len(node.children) == 1:
            return _SCALARS[head], _SCALARS[head]
        inner = [c for c in parts if c.type == "type_declaration"]
        if head in ("vec2", "vec3", "vec4") and len(inner) == 1:
            scalar = self._layout(inner[0], depth + 1)
            return None if scalar is None else _vector(int(head[3]), scalar[1])
        if head.startswith("mat") and len(head) == 6 and len(inner) == 1:
            scalar = self._layout(inner[0], depth + 1)
            return None if scalar is None else _matrix(int(head[3]), int(head[5]), scalar[1])
        if head == "array":
            return self._array(inner, parts, depth)
        if node.child_count == 1 and node.children[0].type == "identifier":
            return self._named(head, depth)
        return None

    def _array(self, inner: list[Node], parts: list[Node], depth: int) -> Layout | None:
        counts = [c for c in parts if c.type == "int_literal"]
        if len(inner) != 1 or len(counts) != 1:
            return None  # runtime-sized or override-sized: not a uniform we can size
        element = self._layout(inner[0], depth + 1)
        count = int(counts[0].text.decode().rstrip("uiUI"), 0)
        if element is None:
            return None
        if self._uniform:
            return _uniform_array(element, count)
        return element[0], count * _round(element[1], element[0])

    def _named(self, name: str, depth: int) -> Layout | None:
        short = _SHORT_VEC.match(name)
        if short:
            return _vector(int(short.group(1)), _SUFFIX[short.group(2)])
        short = _SHORT_MAT.match(name)
        if short:
            return _matrix(int(short.group(1)), int(short.group(2)), _SUFFIX[short.group(3)])
        if name not in self._done:
            self._done[name] = None  # a cycle answers None
            struct = self._structs.get(name)
            self._done[name] = self._struct(struct, depth) if struct is not None else None
        return self._done[name]

    def _struct(self, node: Node, depth: int) -> Layout | None:
        offset, align = 0, 1
        for member in (c for c in node.children if c.type == "struct_member"):
            if any(c.type == "attribute" for c in member.children):
                return None  # @size / @align change the layout
            decl = next((c for c in member.children if c.type == "variable_identifier_declaration"), None)
            type_node = next((c for c in decl.children if c.type == "type_declaration"), None) if decl else None
            layout = self._layout(type_node, depth + 1)
            if layout is None:
                return None
            m_align, m_size = layout
            if self._uniform and type_node is not None and self._is_struct(type_node):
                m_align = _round(m_align, 16)  # uniform rule for struct members
            offset = _round(offset, m_align) + m_size
            align = max(align, m_align)
        return align, _round(offset, align)

    def _is_struct(self, type_node: Node) -> bool:
        return type_node.child_count == 1 and type_node.children[0].text.decode() in self._structs


def _name(node: Node) -> str:
    ident = next((c for c in node.children if c.type == "identifier"), None)
    return ident.text.decode() if ident is not None else ""
