"""A plain kernel rewritten to run a whole group of calls in ONE dispatch.

A group job (docs/protocol.md, "Group frames") holds N calls to one kernel
with one input size, packed into N slots of the batch's buffers at fixed
strides. A plain kernel sees one call's input and output bindings, so
until now each slot was its own set_bind_group + dispatch: on the H100
that is ~8 us of wgpu-native and driver work per call, the largest part
of the GPU thread's cost at 64 callers (docs/benchmarks.md).

Here the kernel's WGSL is rewritten so that one dispatch of (x, y, N)
workgroups covers every slot: workgroup z names the slot, and every use
of the two bindings is redirected into that slot:

* ``input[e]`` reads ``kem_in_at(u32(e))``: the slot's element, or zero
  past the call's input, as a lone call bound to its own range reads
  (robust buffer access returns zero out of bounds on the adapters kem
  runs on; WebGPU allows it);
* ``output[e]`` written, or its address taken for an atomic, indexes
  ``output[kem_out(u32(e))]``: the slot's element, or past the call's
  output the last element of the slot's own padding, so a stray write
  lands where no caller reads it, as a lone call's out-of-range write is
  dropped. A kernel that reads its output keeps one dispatch per call:
  past the output no value matches a lone call's in every case (zero
  after a barrier, the invocation's own write right after it);
* ``arrayLength(&input)`` / ``arrayLength(&output)`` are the call's own
  lengths, and the entry point's ``global_invocation_id``,
  ``workgroup_id`` and ``num_workgroups`` read as they would in a lone
  call (z as if one slot were dispatched).

The lengths and strides come from a small uniform at binding 2 (one
pipeline per kernel, whatever the sizes). The rewrite is done on
tree-sitter's parse tree of the kernel's canonical text (comments gone,
blankspace ASCII: gpu/wgsl_canonical.py, so tree-sitter and naga read the
same program), every use counted again on the WGSL lexer's tokens, and is
refused (``None``, with the reason) for anything it cannot prove it handles: a binding used other than through
``[...]`` or ``arrayLength(&...)``, the input's address taken, an element
type other than a 32-bit scalar or vector (or atomic on the output), any
binding but 0 and 1, entry parameters other than ``vec3<u32>`` builtins,
a workgroup size not written as literals, a parse error, or names that
start with ``kem_``. Refused kernels keep one dispatch per slot; naga
still validates what is produced, and a compile failure also keeps them
there (gpu/slot_dispatch.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from kem_port.errors import KemError
from kem_port.gpu.group.slot_uses import ATOMIC_BUILTINS, Edits, Refused, declaration, element_type, redirect_uses
from kem_port.gpu.wgsl.wgsl_canonical import canonical, identifiers_in, names_declared_in, token_values
from kem_port.gpu.wgsl.wgsl_reflect import _parser, reflect

SLOT_BINDING = 2  # the uniform with the slot lengths and strides
# Element types a slot may hold, with their array stride in bytes.
ELEMENT_STRIDES = {
    "u32": 4, "i32": 4, "f32": 4,
    "vec2<u32>": 8, "vec2<i32>": 8, "vec2<f32>": 8,
    "vec3<u32>": 16, "vec3<i32>": 16, "vec3<f32>": 16,
    "vec4<u32>": 16, "vec4<i32>": 16, "vec4<f32>": 16,
}
# WGSL's predeclared aliases (vec4f is vec4<f32>): the same strides.
ELEMENT_STRIDES.update({f"vec{n}{s}": ELEMENT_STRIDES[f"vec{n}<{t}>"] for n in (2, 3, 4) for s, t in (("u", "u32"), ("i", "i32"), ("f", "f32"))})
OUTPUT_ONLY_STRIDES = {"atomic<u32>": 4, "atomic<i32>": 4}
ADJUSTED_BUILTINS = ("global_invocation_id", "workgroup_id", "num_workgroups")
# Predeclared names the rewrite and its appendix rely on: a kernel that
# declares one of them (WGSL allows shadowing) keeps one dispatch per slot.
PREDECLARED_USED = frozenset({"select", "arrayLength", "array", "atomic", "bool", "u32", "i32", "f32", "vec2", "vec3", "vec4"}
                             | {name for name in ELEMENT_STRIDES if "<" not in name} | set(ATOMIC_BUILTINS))


@dataclass(frozen=True)
class SlotKernel:
    source: str  # the rewritten WGSL
    entry_point: str
    input_stride: int  # bytes per element of binding 0
    output_stride: int  # bytes per element of binding 1


def rewrite(source: str, entry_point: str) -> SlotKernel:
    """The slot form of ``source``'s ``entry_point``, or Refused."""
    source, values = _canonical_tokens(source)
    uses = identifiers_in(values)
    shape = reflect(source)
    entry = shape.entry_points.get(entry_point)
    if entry is None or entry.stage != "compute" or entry.workgroup_size is None:
        raise Refused("the entry point's workgroup size is not integer literals")
    if shape.overrides:
        # The slot form is compiled once per kernel, without a call's
        # constants (gpu/group/slot_dispatch.py): a kernel with overrides
        # keeps one dispatch per slot, each on its own constants' pipeline.
        raise Refused("the kernel declares override constants")
    indexes = sorted((b.group, b.binding) for b in shape.bindings)
    if indexes != [(0, 0), (0, 1)]:
        raise Refused("only kernels with exactly bindings 0 and 1 run as slots")
    by_index = {b.binding: b for b in shape.bindings}
    if by_index[0].address_space != "storage" or by_index[0].access not in ("read", ""):
        raise Refused("the input is not read-only storage")
    if by_index[1].address_space != "storage" or by_index[1].access != "read_write":
        raise Refused("the output is not read_write storage")
    code = data = source.encode("ascii")  # canonical: ASCII, no comments
    tree = _parser().parse(data)
    if any(name.startswith("kem_") for name in uses):
        raise Refused("the kernel already uses names starting with kem_")
    shadowed = names_declared_in(values) & PREDECLARED_USED
    if shadowed:
        # The appended code's select() clamps each output index into its
        # slot; a kernel's own select returned it unclamped and read every
        # slot of the group (red team). Element type names set the strides.
        raise Refused(f"the kernel declares its own {', '.join(sorted(shadowed))}")
    names = {i: b.name for i, b in by_index.items()}
    in_type, out_type = (element_type(code, names[i]) for i in (0, 1))
    if in_type not in ELEMENT_STRIDES:
        raise Refused(f"input element type {in_type!r} is not a 32-bit scalar or vector")
    out_stride = ELEMENT_STRIDES.get(out_type) or OUTPUT_ONLY_STRIDES.get(out_type)
    if out_stride is None:
        raise Refused(f"output element type {out_type!r} is not a 32-bit scalar, vector or atomic")
    edits = Edits(data)
    for name in names.values():
        # The grammar (tree-sitter-wgsl-bevy) reads some valid WGSL as ERROR
        # (atomic<T>, a call as a statement such as workgroupBarrier()):
        # every use of a binding that the WGSL lexer finds (wgsl_canonical,
        # the spec's tokens, not the tree's) must be one this rewrite
        # handled, else one could be left reading other slots unredirected.
        handled = redirect_uses(tree.root_node, name, name == names[0], declaration(code, name).start(), edits,
                                in_type if name == names[0] else out_type)
        if handled + 1 != uses[name]:
            raise Refused(f"{name} is used where this rewrite cannot follow it")
    _adjust_entry(_entry_node(tree.root_node, entry_point), entry.workgroup_size[2], edits)
    text = edits.apply().decode("utf-8") + _appendix(names[0], in_type, names[1])
    return SlotKernel(text, entry_point, ELEMENT_STRIDES[in_type], out_stride)


def _canonical_tokens(source: str) -> tuple[str, list[str]]:
    """The text the rewrite works on, the canonical one (the store gives
    no other; canonical is idempotent), and its tokens, lexed once."""
    try:
        source = canonical(source)
        return source, token_values(source)
    except KemError as exc:
        raise Refused(exc.detail) from None


def _entry_node(root: Node, name: str) -> Node:
    for node in root.children:
        if node.type == "function_declaration":
            ident = next((c for c in node.children if c.type == "identifier"), None)
            if ident is not None and ident.text.decode() == name:
                return node
    raise Refused("no entry point of that name")


def _adjust_entry(fn: Node, workgroup_z: int, edits: Edits) -> None:
    """Builtins read as in a lone call; the slot from the raw workgroup_id.z."""
    params = next((c for c in fn.children if c.type == "parameter_list"), None)
    body = next((c for c in fn.children if c.type == "compound_statement"), None)
    if body is None or body.child(0).type != "{":
        raise Refused("the entry point has no body")
    if any(c.type == "ERROR" or c.has_error for c in fn.children if c is not body):
        raise Refused("the parser did not read the entry point's signature")
    raw_wid = "kem_raw_wid"
    lets = []
    has_wid = False
    for param in params.children if params is not None else []:
        if param.type != "parameter":
            continue
        builtin = _builtin_of(param)
        decl = next((c for c in param.children if c.type == "variable_identifier_declaration"), None)
        if builtin is None or decl is None:
            raise Refused("an entry parameter is not a plain builtin")
        ident, type_ = decl.child(0), next((c for c in decl.children if c.type == "type_declaration"), None)
        if builtin not in ADJUSTED_BUILTINS:
            continue
        if type_ is None or "".join(type_.text.decode().split()) not in ("vec3<u32>", "vec3u"):
            raise Refused(f"builtin {builtin} is not declared vec3<u32>")
        name = ident.text.decode()
        raw = "kem_raw_" + name
        edits.replace(ident.start_byte, ident.end_byte, raw)
        if builtin == "workgroup_id":
            has_wid, raw_wid = True, raw
            lets.append(f"let {name} = vec3<u32>({raw}.x, {raw}.y, 0u);")
        elif builtin == "num_workgroups":
            lets.append(f"let {name} = vec3<u32>({raw}.x, {raw}.y, 1u);")
        else:
            lets.append(f"let {name} = vec3<u32>({raw}.x, {raw}.y, {raw}.z - kem_slot * {workgroup_z}u);")
    if not has_wid:
        extra = "@builtin(workgroup_id) kem_raw_wid: vec3<u32>"
        if params is None or params.named_child_count == 0:
            close = next(c for c in fn.children if c.type == ")")
            edits.replace(close.start_byte, close.start_byte, extra)
        else:
            edits.replace(params.end_byte, params.end_byte, ", " + extra)
    prologue = " ".join([f"kem_slot = {raw_wid}.z;"] + lets)
    edits.replace(body.child(0).end_byte, body.child(0).end_byte, " " + prologue)


def _builtin_of(param: Node) -> str | None:
    for child in param.children:
        if child.type == "attribute":
            parts = [p for p in child.children if p.is_named]
            if len(parts) == 2 and parts[0].text == b"builtin":
                return parts[1].text.decode()
    return None


def _appendix(input_name: str, input_type: str, output_name: str) -> str:
    return f"""

// kem: one dispatch for a group of calls (kem_port/gpu/slot_kernel.py).
// x: input elements a call, y: input stride a slot, z: output elements
// a call, w: output stride a slot (elements); element w - 1 of a slot
// lies past the call's output bytes (a spare for stray writes).
@group(0) @binding({SLOT_BINDING}) var<uniform> kem_slots: vec4<u32>;
var<private> kem_slot: u32;
fn kem_in_at(i: u32) -> {input_type} {{
    if (i < kem_slots.x) {{ return {input_name}[kem_slot * kem_slots.y + i]; }}
    return {input_type}();
}}
fn kem_out(i: u32) -> u32 {{
    return kem_slot * kem_slots.w + select(kem_slots.w - 1u, i, i < kem_slots.z);
}}
"""


def slot_uniform(in_bytes: int, in_stride: int, out_bytes: int, out_stride: int, kernel: SlotKernel) -> tuple[int, int, int, int] | None:
    """The four words of kem_slots for slots of these sizes and strides
    (bytes), or None when they do not fit the slot form: a stride that is
    not a whole number of elements, or no spare element after an output:
    the slot's last element must start past the output's bytes, a partial
    last element of the output included (a 20-byte output of vec4s has one
    element for arrayLength, but a write to the second would touch its
    bytes 16-19). Sizes that are not whole elements keep one dispatch per
    call too: alone robust access read and wrote the in-range words of a
    partial last element, where the slot form's lengths (whole elements)
    read zero and dropped the write (red team 7: 5 words of vec4s)."""
    ie, oe = kernel.input_stride, kernel.output_stride
    if in_bytes % ie or out_bytes % oe or in_stride % ie or out_stride % oe or out_stride - oe < out_bytes:
        return None
    return (in_bytes // ie, in_stride // ie, out_bytes // oe, out_stride // oe)



