"""What kem needs to know about a kernel before it dispatches it.

The WGSL is parsed with tree-sitter's WGSL grammar (a library parser; naga,
which validates the shader, is not reachable from Python). We read only the
declarations that shape a call: the entry point's stage, ``@workgroup_size``
and builtin parameters, and each ``@group/@binding`` variable's address space
and access mode. naga still validates the whole shader when the pipeline is
built; this module never decides whether WGSL is valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import tree_sitter_wgsl_bevy
from tree_sitter import Language, Node, Parser

from kem_port.errors import first_names
from kem_port.gpu.wgsl.wgsl_layout import UniformSizes
from kem_port.gpu.wgsl.wgsl_workgroup import module_consts, workgroup_vars


@dataclass(frozen=True)
class Binding:
    group: int
    binding: int
    name: str
    address_space: str  # "storage", "uniform", ... ("" if not written)
    access: str  # "read", "read_write" or "" (uniform / default)
    min_size: int | None = None  # a uniform's or a fixed-size storage type's size (wgsl_layout), None if unknown or runtime-sized
    element_size: int | None = None  # a storage array's element stride (wgsl_layout), None if unknown
    members: tuple[tuple[str, str], ...] = ()  # a uniform struct's (name, type) members, in order


@dataclass(frozen=True)
class EntryPoint:
    name: str
    stage: str | None  # "compute", "vertex", "fragment" or None
    workgroup_size: tuple[int, int, int] | None  # None when not integer literals
    workgroup_size_text: str
    builtins: frozenset[str]
    # What the contract's default dispatch rules read (gpu/contract.py sets
    # them for the kernel's own output and params; gpu/dispatch.py).
    output_stride: int | None = None  # bytes an output element (None: 4, kem@1.0's words)
    image_params: bool = False  # params begin (width, height): the image rule may apply


@dataclass(frozen=True)
class Override:
    """A pipeline-overridable constant: ``[@id(N)] override NAME[: T][ = init];``."""

    name: str
    type: str  # "u32", "i32", "f32", "f16", "bool"; inferred from a literal initializer when not written
    has_default: bool
    id: int | None = None  # @id(N): WebGPU keys the constant by N's digits, not the name
    default: int | float | None = None  # the initializer when it is one literal (None: an expression, or none)

    @property
    def key(self) -> str:
        """The key WebGPU's pipeline constants take for it."""
        return str(self.id) if self.id is not None else self.name


@dataclass(frozen=True)
class KernelShape:
    entry_points: dict[str, EntryPoint]
    bindings: tuple[Binding, ...]
    overrides: tuple[Override, ...] = ()
    # (name, type text) of each var<workgroup> whose size may name an
    # override, aliases followed: gpu/constants.py holds the sizes a
    # constants set gives to admission/limits.py's bound on literal ones.
    workgroup_vars: tuple[tuple[str, str], ...] = ()
    override_inits: tuple[tuple[str, str], ...] = ()  # (name, initializer text) of overrides with one
    const_inits: tuple[tuple[str, str], ...] = ()  # (name, initializer text) of module consts, where a workgroup size is not literal

    def compute_entries(self) -> str:
        """The @compute entry points' names, for an error that lists them (plain functions are not
        entry points), 16 then counted: 2,000 of them were a 13 KB list."""
        return first_names([e.name for e in self.entry_points.values() if e.stage == "compute"]) or "none"

    def binding(self, group: int, index: int) -> Binding | None:
        for b in self.bindings:
            if b.group == group and b.binding == index:
                return b
        return None


@lru_cache(maxsize=1)
def _parser() -> Parser:
    return Parser(Language(tree_sitter_wgsl_bevy.language()))


def parse_int_literal(text: str) -> int | None:
    t = text.strip().rstrip("uiUI")
    try:
        return int(t, 16) if t.lower().startswith("0x") else int(t, 10)
    except ValueError:
        return None


def _attributes(node: Node) -> list[tuple[str, list[Node]]]:
    attrs = []
    for child in node.children:
        if child.type != "attribute":
            continue
        name = ""
        args: list[Node] = []
        for part in child.children:
            if part.type == "identifier" and not name:
                name = part.text.decode()
            elif part.is_named and name:
                args.append(part)
        attrs.append((name, args))
    return attrs


def _entry_point(node: Node) -> EntryPoint | None:
    name = None
    for child in node.children:
        if child.type == "identifier":
            name = child.text.decode()
            break
    if name is None:
        return None
    stage = None
    size: tuple[int, int, int] | None = None
    size_text = ""
    for attr, args in _attributes(node):
        if attr in ("compute", "vertex", "fragment"):
            stage = attr
        elif attr == "workgroup_size":
            size_text = ", ".join(a.text.decode() for a in args)
            values = [parse_int_literal(a.text.decode()) if a.type == "int_literal" else None for a in args]
            if values and all(v is not None for v in values):
                size = tuple((values + [1, 1])[:3])  # type: ignore[assignment]
    return EntryPoint(name, stage, size, size_text, frozenset(_builtins(node)))


def _builtins(fn: Node) -> list[str]:
    found = []
    for child in fn.children:
        if child.type != "parameter_list":
            continue
        for param in child.children:
            for attr, args in _attributes(param):
                if attr == "builtin" and args:
                    found.append(args[0].text.decode())
    return found


def _binding(node: Node, sizes: UniformSizes, storage: UniformSizes) -> Binding | None:
    group = index = None
    for attr, args in _attributes(node):
        if attr in ("group", "binding") and args and args[0].type == "int_literal":
            value = parse_int_literal(args[0].text.decode())
            if attr == "group":
                group = value
            else:
                index = value
    if group is None or index is None:
        return None
    space = access = name = ""
    type_node = None
    for sub in _walk(node):
        if sub.type == "address_space":
            space = sub.text.decode()
        elif sub.type == "access_mode":
            access = sub.text.decode()
        elif sub.type == "variable_identifier_declaration" and not name:
            ident = sub.child(0)
            name = ident.text.decode() if ident is not None else ""
            type_node = next((c for c in sub.children if c.type == "type_declaration"), None)
    if space == "uniform":
        return Binding(group, index, name, space, access, sizes.size_of(type_node), None, sizes.members(type_node))
    element = storage.element_stride(type_node) if space == "storage" else None
    size = storage.size_of(type_node) if space == "storage" else None  # None for a runtime-sized array
    return Binding(group, index, name, space, access, size, element)


def _literal(node: Node) -> tuple[str | None, int | float | None]:
    """(type, value) of a literal initializer; (None, None) for anything else."""
    lit = node.child(0) if node.type == "const_literal" and node.child_count == 1 else node
    text = lit.text.decode()
    if lit.type == "int_literal":
        kind = "u32" if text[-1:] in "uU" else "i32"  # an abstract int concretizes to i32
        return kind, parse_int_literal(text)
    if lit.type == "float_literal":
        kind = "f16" if text[-1:] == "h" else "f32"
        try:
            return kind, float(text.rstrip("fh"))
        except ValueError:
            return kind, None  # hex floats: typed, value unread
    if lit.type == "bool_literal" or text in ("true", "false"):
        return "bool", int(text == "true")
    return None, None


def _override(node: Node) -> Override | None:
    if not any(c.type == "override" for c in node.children):
        return None
    ident = node_id = kind = None
    init: Node | None = None
    after_equals = False
    for child in node.children:
        if child.type == "variable_identifier_declaration":
            ident = child.child(0).text.decode() if child.child(0) is not None else None
            decl = next((c for c in child.children if c.type == "type_declaration"), None)
            kind = decl.text.decode() if decl is not None else None
        elif child.type == "identifier" and ident is None:
            ident = child.text.decode()
        elif child.type == "=":
            after_equals = True
        elif after_equals and child.is_named and init is None:
            init = child
    for attr, args in _attributes(node):
        if attr == "id" and args and args[0].type == "int_literal":
            node_id = parse_int_literal(args[0].text.decode())
    if ident is None:
        return None
    literal_kind, value = _literal(init) if init is not None else (None, None)
    return Override(ident, kind or literal_kind or "", init is not None, node_id, value)


def _walk(node: Node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def reflect(source: str) -> KernelShape:
    """Entry points and resource bindings declared at the top level of source."""
    tree = _parser().parse(source.encode("utf-8"))
    entries: dict[str, EntryPoint] = {}
    bindings: list[Binding] = []
    overrides: list[Override] = []
    sizes, storage = UniformSizes(tree.root_node), UniformSizes(tree.root_node, uniform=False)
    for node in tree.root_node.children:
        if node.type == "function_declaration":
            ep = _entry_point(node)
            if ep is not None:
                entries[ep.name] = ep
        elif node.type == "global_variable_declaration":
            b = _binding(node, sizes, storage)
            if b is not None:
                bindings.append(b)
        elif node.type == "global_constant_declaration":
            o = _override(node)
            if o is not None:
                overrides.append(o)
    # Consts where a workgroup size names one (const WG = 256u: gas counts invocations by it) or an
    # override may (override N: u32 = C * 4u: a workgroup array's bytes are counted by it).
    consts = module_consts(source) if overrides or any(e.workgroup_size is None and e.workgroup_size_text for e in entries.values()) else ()
    return KernelShape(entries, tuple(bindings), tuple(overrides), *(workgroup_vars(source) if overrides else ((), ())), consts)
