"""kem's kernel contract, every binding rule of it in one place.

A kernel reads its input at ``@group(0) @binding(0)`` (``var<storage, read>``
or ``read_write``), writes its output at ``@binding(1)``
(``var<storage, read_write>``) and, when called with params, reads them at
``@binding(2)`` (``var<uniform>``). A kernel that declares the call table
at ``@binding(3)`` (``var<storage, read>``) opts in to many calls per
dispatch (gpu/call_table.py, docs/dispatch.md). A call made with
``debug => true`` may also bind the debug channel at ``@binding(15)``
(``var<storage, read_write>``, docs/debug.md). Nothing else is bound. The
binding numbers appear in this file only.
"""

from __future__ import annotations

from dataclasses import replace

import wgpu

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.constants import resolve_entry
from kem_port.gpu.wgsl.wgsl_reflect import Binding, EntryPoint, KernelShape

GROUP = 0
INPUT, OUTPUT, PARAMS, TABLE = 0, 1, 2, 3
DEBUG = 15
UNIFORM_ALIGN = 16  # WGSL's uniform size rounding
MIN_UNIFORM_BYTES = 256


def pad4(n: int) -> int:
    return (n + 3) & ~3


def align(n: int, a: int) -> int:
    return -(-n // a) * a


def input_binding_size(call: KernelCall) -> int:
    """Bound input bytes: padded to whole words, never empty."""
    return max(pad4(len(call.input)), 4)


def output_binding_size(call: KernelCall) -> int:
    return pad4(call.output_size)


def params_binding_size(call: KernelCall) -> int:
    """Bound uniform bytes (0 without params)."""
    if call.params is None:
        return 0
    return max(align(len(call.params), UNIFORM_ALIGN), MIN_UNIFORM_BYTES)


def check_sizes(call: KernelCall, binding_limit: int, uniform_limit: int) -> None:
    """The call's buffers must fit this adapter's binding limits."""
    for what, size in (("input", input_binding_size(call)), ("output", output_binding_size(call))):
        if size > binding_limit:
            raise too_large(f"{what} of {size} bytes is over this adapter's storage binding limit of {binding_limit}")
    if call.params is not None and align(len(call.params), UNIFORM_ALIGN) > uniform_limit:
        raise too_large(f"params of {len(call.params)} bytes exceed the uniform limit {uniform_limit}")


def uses_call_table(shape: KernelShape) -> bool:
    """Whether the kernel declares the call table (read-only storage at binding 3)."""
    table = shape.binding(GROUP, TABLE)
    return table is not None and table.address_space == "storage" and table.access in ("", "read")


def check_table_call(entry: EntryPoint | None, call: KernelCall) -> None:
    """A call-table kernel is dispatched by kem over its calls' output words."""
    if call.params is not None or call.workgroups is not None or call.grid is not None:
        raise bad_args("a kernel with a call table (@binding(3)) takes neither params nor workgroups nor grid")
    size = entry.workgroup_size if entry is not None else None
    if size is None or size[1:] != (1, 1):
        raise KemError("bad_kernel", "a kernel with a call table needs @workgroup_size(X) with an integer X (one row)")


def check_layout(shape: KernelShape, call: KernelCall) -> EntryPoint | None:
    """The kernel must fit kem's contract: group 0, bindings 0-1 (and 2 with
    params, or 3 for the call table)."""
    entry = shape.entry_points.get(call.entry_point)
    if shape.entry_points and entry is None:
        raise KemError("bad_kernel", f"no @compute entry point {call.entry_point!r} (found {shape.compute_entries()})")
    if entry is not None and entry.stage not in (None, "compute"):
        raise KemError("bad_kernel", f"entry point {call.entry_point!r} is a {entry.stage} shader, not @compute")
    # Constants first: they size an override-sized workgroup, which every
    # check below and the dispatch rules read (gpu/constants.py).
    entry = resolve_entry(entry, shape, call.constants)
    if not shape.bindings:
        return entry
    tabled = uses_call_table(shape)
    check_debug(shape, call)
    allowed = (INPUT, OUTPUT, PARAMS, TABLE) if tabled else (INPUT, OUTPUT, PARAMS)
    allowed += (DEBUG,) if call.debug else ()
    extra = [b for b in shape.bindings if b.group != GROUP or b.binding not in allowed]
    if extra:
        b = extra[0]
        raise KemError("bad_kernel", f"{b.name} at @group({b.group}) @binding({b.binding}): kem binds only group 0, bindings 0-2 (3: the call table, var<storage, read>)")
    if tabled:
        check_table_call(entry, call)
    output = shape.binding(GROUP, OUTPUT)
    if output is None or output.address_space != "storage" or output.access != "read_write":
        raise KemError("bad_kernel", "binding 1 must be the output: var<storage, read_write>")
    inp = shape.binding(GROUP, INPUT)
    if inp is None or inp.address_space != "storage":
        raise KemError("bad_kernel", "binding 0 must be the input: var<storage, read>")
    uniform = shape.binding(GROUP, PARAMS)
    if uniform is not None and uniform.address_space != "uniform":
        raise KemError("bad_kernel", "binding 2 must be the params: var<uniform>")
    if call.params is not None and uniform is None:
        raise bad_args("params given, but the kernel declares no @binding(2) var<uniform>")
    if call.params is None and uniform is not None:
        raise bad_args("the kernel reads params (@binding(2)); call it with params")
    check_params_size(shape, call.params)
    if entry is None:
        return None
    return replace(entry, output_stride=output.element_size, image_params=image_params(uniform))


IMAGE_FIELDS = (("width", "w"), ("height", "h"))  # the image rule's params, as kem@1.0's pixelize declares them


def image_params(uniform: Binding | None) -> bool:
    """Whether a kernel's params begin with an image's width and height
    (32-bit integers named width/w, height/h): only then may the image
    rule size its dispatch from them (gpu/dispatch.py). A GELU whose
    params are (rows, cols) got the image rule with its axes crossed and
    left 768 of 3,072 outputs unwritten (issue 25)."""
    if uniform is None or len(uniform.members) < 2:
        return False
    return all(name.lower() in names and kind in ("u32", "i32")
               for (name, kind), names in zip(uniform.members, IMAGE_FIELDS))


def check_params_size(shape: KernelShape, params: bytes | None) -> None:
    """Params must fill the kernel's uniform. Checked on every call, not
    only where a pipeline is compiled: the caches key on whether there are
    params, not on how many bytes."""
    uniform = shape.binding(GROUP, PARAMS)
    if params is not None and uniform is not None and uniform.min_size is not None and len(params) < uniform.min_size:
        raise bad_args(
            f"params are {len(params)} bytes, but the kernel's uniform {uniform.name!r} "
            f"is {uniform.min_size} bytes: send every field (32-bit words, little-endian)"
        )


def check_debug(shape: KernelShape, call: KernelCall) -> None:
    """The debug channel: read_write storage, bound only in debug mode."""
    debug = shape.binding(GROUP, DEBUG)
    if debug is None:
        return
    if not call.debug:
        raise KemError("bad_kernel", f"{debug.name} at @binding(15) is the debug channel: call with debug => true, or remove it (docs/debug.md)")
    if debug.address_space != "storage" or debug.access != "read_write":
        raise KemError("bad_kernel", "binding 15 must be the debug channel: var<storage, read_write> (docs/debug.md)")
    if uses_call_table(shape):
        raise bad_args("a kernel with a call table (@binding(3)) cannot use the debug channel")


def declares_debug(shape: KernelShape) -> bool:
    return shape.binding(GROUP, DEBUG) is not None


def debug_entry(buffer: wgpu.GPUBuffer, size: int) -> dict:
    return {"binding": DEBUG, "resource": {"buffer": buffer, "offset": 0, "size": size}}


def layout_entries(shape: KernelShape, has_params: bool) -> list[dict]:
    """The bind group layout of a kernel: the input read-only unless the
    kernel declares it read_write."""
    input_binding = shape.binding(GROUP, INPUT)
    input_type = "storage" if input_binding is not None and input_binding.access == "read_write" else "read-only-storage"
    entries = [
        {"binding": INPUT, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": input_type}},
        {"binding": OUTPUT, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "storage"}},
    ]
    if has_params:
        entries.append({"binding": PARAMS, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "uniform"}})
    if uses_call_table(shape):
        entries.append({"binding": TABLE, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "read-only-storage"}})
    if declares_debug(shape):  # check_debug let it through: a debug call
        entries.append({"binding": DEBUG, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "storage"}})
    return entries


def group_entries(
    inputs: tuple[wgpu.GPUBuffer, int, int],
    outputs: tuple[wgpu.GPUBuffer, int, int],
    params: tuple[wgpu.GPUBuffer, int, int] | None,
    table: tuple[wgpu.GPUBuffer, int, int] | None = None,
) -> list[dict]:
    """A call's bind group: each (buffer, offset, size) at its binding."""
    bound = [(INPUT, inputs), (OUTPUT, outputs)] + ([(PARAMS, params)] if params is not None else [])
    bound += [(TABLE, table)] if table is not None else []
    return [
        {"binding": binding, "resource": {"buffer": buf, "offset": offset, "size": size}}
        for binding, (buf, offset, size) in bound
    ]
