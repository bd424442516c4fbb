"""Cheap structural limits on a kernel, checked before anything compiles it.

naga (inside wgpu-native) recurses once per nesting level and limits only
braces: a few thousand nested parentheses or calls, a flat sum of ~15,000
terms (a left-leaning tree that deep) or an ``else if`` chain of ~10,000
arms overflow the compiling thread's stack. Every one of those is a deep
syntax tree, so one iterative walk over the tree-sitter tree kem already
builds (wgsl_reflect) bounds them all: the tree's depth, its size, and the
element counts of arrays declared with literal sizes (a large private array
made compilation grow by hundreds of MB/s), and each entry point's code
with every call inlined (gpu/wgsl_calls.py: the driver inlines, so 17
nested doubling helpers, 1.3 KB of source, are 2^17 copies of the first
and compiled for 9.6 s). What this walk cannot see (sizes named by
constants) is left to the sacrificial compile (admission/guard.py), which
has resource limits.

Figures (tests/test_admission/guard.py prints them): kem's own kernels reach
depth < 40; 5,000 nested parentheses are depth ~5,000, found in ~4 ms.
"""

from __future__ import annotations

from tree_sitter import Node

from kem_port.errors import KemError
from kem_port.gpu.constants import literal_elements
from kem_port.gpu.wgsl.wgsl_calls import call_graph, expanded_sizes, reachable
from kem_port.gpu.wgsl.wgsl_canonical import token_values
from kem_port.gpu.wgsl.wgsl_reflect import _parser, parse_int_literal
from kem_port.gpu.wgsl.wgsl_workgroup import workgroup_vars

MAX_SOURCE_BYTES = 1 << 20  # KEM_MAX_KERNEL_BYTES' default
MAX_TREE_DEPTH = 400  # ~130 nested parentheses (3 tree levels each), 400 chained terms
MAX_TREE_NODES = 200_000  # a 60 KB kernel is ~20,000
MAX_PRIVATE_ELEMENTS = 16_384  # per invocation, private or function arrays
MAX_WORKGROUP_ELEMENTS = 65_536
# Syntax nodes of an entry point with every call inlined. Real kernels are
# far below: kem's largest (pixelize) is 423, its session kernels <= 293,
# a kernel with three helpers called 7 times (tests/test_compile_guard.py)
# ~400. Nested doubling helpers on lavapipe (2 loaded cores): 2^9 copies =
# 32,784 nodes compiled in 0.2 s, 2^10 = 65,552 in 0.8 s, 2^11 in 3.7 s,
# 2^12 in 22 s. The bound, on the nodes inlining adds (the total less one
# copy of each reachable function), lets 2^9 through and refuses 2^11, in
# ~1 ms; 2^10 adds 65,132 nodes for a 0.8 s compile.
# (A flat chain of dependent statements costs more per node, 28,000 nodes
# in 4.8 s: the compile worker's deadline stays the backstop for that.)
MAX_INLINED_NODES = 65_536


def rejected(detail: str) -> KemError:
    return KemError("kernel_rejected", detail)


def check_structure(source: str) -> None:
    """Raise kernel_rejected when source is too big, too deep or declares
    arrays too large for any kem kernel."""
    data = source.encode("utf-8")
    if len(data) > MAX_SOURCE_BYTES:
        raise rejected(f"kernel source of {len(data)} bytes is over {MAX_SOURCE_BYTES}")
    tree = _parser().parse(data)
    _check_tree(tree.root_node)
    _check_inlined(tree.root_node)
    _check_workgroup_elements(source)
    _check_var_templates(source)


def _check_var_templates(source: str) -> None:
    """Every ``var<...>`` written plainly: an address space and an access
    mode, names and one comma between them. naga also takes a parenthesised
    argument and a trailing comma (``var<(workgroup)>``, ``var<storage,
    read,>``); kem's token readers (the clearing, the byte count, the slot
    form's rewrite) read the plain form, and red team 9's
    ``var<(workgroup)>`` went uncleared. So what naga compiles and what kem
    reads cannot differ there: anything else is refused."""
    try:
        values = token_values(source)
    except KemError:
        return  # text the lexer refuses is refused by the clearing and the store
    n = len(values)
    for i in range(n - 1):
        if values[i] != "var" or values[i + 1] != "<":
            continue
        j, expect_name = i + 2, True
        while j < n and values[j] != ">":
            word = values[j][0].isalpha() or values[j][0] == "_"
            if word != expect_name or (not word and values[j] != ","):
                raise rejected("write var<address_space> or var<address_space, access> plainly: "
                               f"kem does not read var<{' '.join(values[i + 2 : min(j + 1, i + 8)])} ...>")
            j, expect_name = j + 1, not expect_name
        if j >= n or expect_name:  # no '>', an empty template or a trailing comma
            raise rejected("write var<address_space> or var<address_space, access> plainly (a var template without its closing '>', "
                           "empty, or ending in a comma)")


def _check_workgroup_elements(source: str) -> None:
    """Each var<workgroup> counted by its elements through aliases,
    structs and consts (gpu/wgsl/wgsl_workgroup.py): the tree walk sees
    one declaration's literal counts only, and array<Row, 65536> with
    Row an alias (or a struct) of 64 floats, or a const-sized
    array<f32, BIG>, ran 16 MiB of workgroup memory on lavapipe (red team
    of wave 3; wgpu-native 22 does not hold it to the adapter's 32 KiB).
    A count naming an override is gpu/constants.py's, per constants set."""
    for name, type_text in workgroup_vars(source)[0]:
        count = literal_elements(type_text)
        if count is not None and count > MAX_WORKGROUP_ELEMENTS:
            raise rejected(f"var<workgroup> {name} holds {count} elements (arrays, aliases, structs and consts counted through), "
                           f"over the limit of {MAX_WORKGROUP_ELEMENTS}")


def _check_inlined(root: Node) -> None:
    """An entry point whose code grows by over the bound when every call
    is inlined (memoised over the call graph: the 2^40 case costs what 2^10
    does). The growth, not the total: one copy of each function it reaches
    is the kernel's own size, which the node and depth limits bound; counted
    in, a 170 KB generated kernel with no calls at all (67,000 nodes,
    compiled in 1.4 s) was refused as a blow-up (compatibility sweep)."""
    graph = call_graph(root)
    # Saturating above the largest own size plus the bound keeps a
    # saturated total a refusal (_check_tree has bounded the own size).
    sizes = expanded_sizes(graph, MAX_TREE_NODES + MAX_INLINED_NODES)
    for entry in graph.entries:
        own = sum(graph.own_nodes[name] for name in reachable(graph, entry))
        if sizes.get(entry, 0) - own > MAX_INLINED_NODES:
            raise rejected(f"entry point {entry}, with its function calls inlined, grows by over {MAX_INLINED_NODES} syntax nodes "
                           "(helpers that call helpers several times grow it exponentially)")


def _check_tree(root: Node) -> None:
    cursor = root.walk()
    depth = nodes = 0
    while True:
        nodes += 1
        if nodes > MAX_TREE_NODES:
            raise rejected(f"kernel has more than {MAX_TREE_NODES} syntax nodes")
        if cursor.node.type == "type_declaration":
            _check_array(cursor.node)
        if cursor.goto_first_child():
            depth += 1
            if depth > MAX_TREE_DEPTH:
                raise rejected(f"kernel nests deeper than {MAX_TREE_DEPTH} syntax levels (parentheses, calls, blocks, else-if or operator chains)")
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return
            depth -= 1


def _check_array(node: Node) -> None:
    """An array type whose literal element count (nested counts multiplied)
    exceeds what its address space may hold."""
    count = _elements(node)
    if count <= MAX_PRIVATE_ELEMENTS:
        return
    space = _address_space(node)
    limit = MAX_WORKGROUP_ELEMENTS if space == "workgroup" else MAX_PRIVATE_ELEMENTS
    if space in ("storage", "uniform", "struct") or count <= limit:
        return
    raise rejected(f"a {space or 'function'} array of {count} elements is over the limit of {limit}")


def _elements(node: Node) -> int:
    total = 1
    current: Node | None = node
    while current is not None and current.children and current.children[0].type == "array":
        inner = None
        for child in current.children:
            if child.type == "int_literal":
                total *= max(parse_int_literal(child.text.decode()) or 1, 1)
            elif child.type == "type_declaration":
                inner = child
        current = inner
    return total


def _address_space(node: Node) -> str:
    """The address space of the variable declaring node ("" for function
    scope or let/const, which hold no array storage of their own)."""
    parent = node.parent
    while parent is not None and parent.type not in ("variable_declaration", "struct_declaration"):
        parent = parent.parent
    if parent is None:
        return ""
    if parent.type == "struct_declaration":
        return "struct"  # a member: its variable's space is checked by naga's limits
    for child in parent.children:
        if child.type == "variable_qualifier":
            for part in child.children:
                if part.type == "address_space":
                    return part.text.decode()
    return ""
