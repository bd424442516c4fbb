"""A kernel's call graph, read off the tree-sitter tree kem already builds:
which functions an entry point reaches, whether any of them loops, and
how large its code would be with every call inlined.

WGSL has no recursion (the call graph is a DAG) and no goto, so a kernel
runs long only through a loop statement (``loop``, ``for``, ``while``) or
a large dispatch; an entry point whose reachable code has none runs each
invocation in bounded time (docs/executor.md, "What runs on the reader").

A call site is any identifier naming a declared function inside another
function's body: tree-sitter's WGSL grammar reads a call statement
(``f(&a);``) as a broken assignment, so the call expression node alone
would miss it. Counting every such identifier can only over-count (a local
named like a function), which errs on the safe side for both questions.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from tree_sitter import Node

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import sequence_in, token_values

LOOP_WORDS = frozenset({"loop", "for", "while"})  # reserved words: never an identifier in valid WGSL
# Line breaks other than LF (WGSL's list): tree-sitter ends a line comment
# only at LF, naga at any of these, so such a comment may hide code.
ODD_BREAKS = frozenset("\r\v\f\x85\u2028\u2029")
STAGES = (b"compute", b"vertex", b"fragment")


@dataclass
class CallGraph:
    own_nodes: dict[str, int] = field(default_factory=dict)  # syntax nodes of each function's declaration
    calls: dict[str, list[str]] = field(default_factory=dict)  # callee names, one per call site
    loops: set[str] = field(default_factory=set)  # functions whose own code has a loop statement
    entries: list[str] = field(default_factory=list)  # functions with a stage attribute
    opaque: bool = False  # a parse error or a comment that may hide code: trust no "no loop" answer


def call_graph(root: Node) -> CallGraph:
    """One iterative walk of every top-level function."""
    graph = CallGraph()
    functions: list[tuple[str, Node]] = []
    for node in root.children:
        name = _declared_name(node) if node.type == "function_declaration" else None
        if name is not None:
            functions.append((name, node))
            if _is_entry(node):
                graph.entries.append(name)
        elif node.type == "ERROR":
            graph.opaque = True
    names = {name for name, _ in functions}
    for name, node in functions:
        graph.own_nodes[name], graph.calls[name], loops = _scan(node, names, graph)
        if loops:
            graph.loops.add(name)
    if _has_suspect_comment_or_error(root):
        graph.opaque = True
    return graph


def _declared_name(node: Node) -> str | None:
    for child in node.children:
        if child.type == "identifier":
            return child.text.decode()
    return None


def _is_entry(fn: Node) -> bool:
    for attr in fn.children:
        if attr.type == "attribute" and any(p.type == "identifier" and p.text in STAGES for p in attr.children):
            return True
    return False


def _scan(fn: Node, names: set[str], graph: CallGraph) -> tuple[int, list[str], bool]:
    count, calls, loops = 0, [], False
    body = [c for c in fn.children if c.type not in ("identifier", "attribute")]  # skip its own name
    stack = list(body)
    while stack:
        node = stack.pop()
        count += 1
        if node.type in ("loop_statement", "for_statement", "while_statement"):
            loops = True
        if not node.children:
            text = node.text.decode("utf-8", "replace") if node.type != "comment" else ""
            if text in LOOP_WORDS:
                loops = True
            elif text in names:  # any leaf: tree-sitter reads a function named `f16` as the type keyword
                calls.append(text)
        stack.extend(node.children)
    return count + 1, calls, loops


def _has_suspect_comment_or_error(root: Node) -> bool:
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR":
            return True
        if "comment" in node.type:
            if any(ch in ODD_BREAKS for ch in node.text.decode("utf-8", "replace")):
                return True
            continue
        stack.extend(node.children)
    return False


def reachable(graph: CallGraph, entry: str) -> set[str]:
    seen = {entry}
    stack = [entry]
    while stack:
        for callee in graph.calls.get(stack.pop(), ()):
            if callee not in seen:
                seen.add(callee)
                stack.append(callee)
    return seen


def expanded_sizes(graph: CallGraph, cap: int) -> dict[str, int]:
    """Each function's syntax nodes with every call inlined: its own plus,
    per call site, the callee's expanded size; memoised in one post-order
    walk (iterative: depth is the caller's to choose). Saturates at cap+1,
    so a 2^40-node blow-up costs no more than one over the cap. A cycle
    (recursion, which naga refuses) counts its back edge as 0."""
    sizes: dict[str, int] = {}
    for root in graph.own_nodes:
        if root in sizes:
            continue
        stack: list[tuple[str, bool]] = [(root, False)]
        on_path: set[str] = set()
        while stack:
            name, done = stack.pop()
            if done:
                on_path.discard(name)
                total = graph.own_nodes[name] + sum(sizes.get(c, 0) for c in graph.calls[name])
                sizes[name] = min(total, cap + 1)
                continue
            if name in sizes or name in on_path:
                continue
            on_path.add(name)
            stack.append((name, True))
            stack.extend((c, False) for c in set(graph.calls[name]) if c not in sizes and c not in on_path)
    return sizes


def _no_loop_token(text: str, entry: str) -> bool:
    """Whether the WGSL lexer finds entry declared and no loop keyword
    anywhere in text: then nothing loops, whatever tree-sitter parses.
    Its grammar fails on much valid WGSL (module-scope ``const``, a
    ``workgroupBarrier();`` statement, ``alias``): 827 of 2,489 valid
    compute entry points of a sweep of public kernels had no loop token
    yet were answered "may loop" (opaque) and kept off the reader."""
    try:
        values = token_values(text)  # one lex for both questions
    except KemError:
        return False
    return sequence_in(values, ("fn", entry)) > 0 and LOOP_WORDS.isdisjoint(values)


_MAY_LOOP: OrderedDict[tuple[str, str], bool] = OrderedDict()
_MAY_LOOP_KEPT = 1024  # (kernel, entry) answers kept: one parse each, a few ms for a large kernel


def may_loop(text: str, sha256: str, entry: str) -> bool:
    """Whether entry may loop: False only when the lexer finds entry
    declared and no loop keyword anywhere in text. Lexed once per kernel
    and entry point; later calls are one dict lookup."""
    key = (sha256, entry)
    known = _MAY_LOOP.get(key)
    if known is not None:
        return known
    # Any loop token anywhere, reachable or not, answers "may loop": that is
    # exactly when the kernel's gas form is metered (gpu/wgsl/wgsl_gas.py),
    # so a road that takes only loop-free kernels never meets a pipeline
    # that binds the gas meter.
    answer = not _no_loop_token(text, entry)
    _MAY_LOOP[key] = answer
    while len(_MAY_LOOP) > _MAY_LOOP_KEPT:
        _MAY_LOOP.popitem(last=False)
    return answer


def used_names(text: str, entry: str) -> set[str] | None:
    """Every identifier in the functions entry reaches, read off the spec
    lexer's tokens (wgsl_canonical: exact, where tree-sitter's grammar
    fails on much valid WGSL); None when entry is not found. A superset of
    the module-scope names entry uses: a global is used only through its
    name, so no use is missed (a local named like a global only adds it)."""
    try:
        values = token_values(text)
    except KemError:
        return None
    bodies = _function_bodies(values)
    if entry not in bodies:
        return None
    seen, stack, names = {entry}, [entry], set()
    while stack:
        for value in bodies[stack.pop()]:
            if value[0].isalpha() or value[0] == "_":
                names.add(value)
                if value in bodies and value not in seen:
                    seen.add(value)
                    stack.append(value)
    return names


def names_reached(values: list[str], wanted: frozenset[str]) -> dict[str, frozenset[str]]:
    """For every module-scope function, which of `wanted` (module-scope
    names) it or any function it calls names, off already lexed tokens.
    Each body is scanned once and each function's set is built once from
    its callees' (used_names once per entry point lexed and walked the
    whole kernel each time: 3,000 entry points of a 277 KB kernel took
    115 s to clear). A callee is any token naming a function, so a local,
    parameter or member named like one makes a false edge, and a false
    edge can close a cycle naga accepts (fn total() { var sum ... } called
    by fn sum). A function on a cycle, or reaching one, is left out of the
    map, and its callers clear and count every variable: a set cut short
    at the cycle left w uncleared in sum (review's red team: the previous
    caller's words read back)."""
    bodies = _function_bodies(values)
    direct = {f: frozenset(v for v in body if v in wanted) for f, body in bodies.items()}
    callees = {f: frozenset(v for v in body if v in bodies) for f, body in bodies.items()}
    reached: dict[str, frozenset[str]] = {}
    left_out: set[str] = set()
    visiting: set[str] = set()  # expanded, not yet finished: met again, it closes a cycle
    for root in bodies:
        stack = [(root, False)]
        while stack:
            name, expanded = stack.pop()
            if expanded:
                visiting.discard(name)
                if any(c in left_out or c not in reached for c in callees[name]):
                    left_out.add(name)  # a callee on a cycle (not finished), or reaching one
                else:
                    reached[name] = direct[name].union(*(reached[c] for c in callees[name]))
            elif name not in reached and name not in left_out and name not in visiting:
                visiting.add(name)
                stack.append((name, True))
                stack.extend((c, False) for c in callees[name])
    return reached


def _function_bodies(values: list[str]) -> dict[str, list[str]]:
    """Each module-scope function's tokens, from its parameters to the end
    of its body (braces in WGSL delimit blocks and struct bodies only)."""
    bodies: dict[str, list[str]] = {}
    depth, i = 0, 0
    while i < len(values):
        value = values[i]
        if value == "fn" and depth == 0 and i + 1 < len(values):
            name, start = values[i + 1], i + 2
            j, inner = start, 0
            while j < len(values) and not (values[j] == "{" and inner == 0):
                inner += values[j] == "("
                inner -= values[j] == ")"
                j += 1
            body_depth = 0
            while j < len(values):
                body_depth += values[j] == "{"
                body_depth -= values[j] == "}"
                j += 1
                if body_depth == 0:
                    break
            bodies[name] = values[start:j]
            i = j
            continue
        depth += value == "{"
        depth -= value == "}"
        i += 1
    return bodies
