"""What a device bounds for one workgroup, held by kem before a pipeline is
built: the workgroup's size (invocations) and its var<workgroup> memory.

wgpu-native holds neither to the device's limits. On lavapipe (1024
invocations, 32 KiB) it built and ran an override-sized
``@workgroup_size(WG)`` with WG = 4096, and kernels with 256 KiB of
workgroup memory. On an H100 (48 KiB: ``maxComputeWorkgroupStorageSize``
49,152) the first call of such a kernel never returned: the port waited on
the GPU for good, and every later call with it (session 8, on the lent
GPU). So kem sums the memory itself, as WebGPU defines the limit: for each
variable the entry point uses, its size by WGSL's layout rules
(gpu/wgsl/wgsl_workgroup_bytes.workgroup_bytes) rounded up to 16 bytes; a
declaration it did not read (var<(workgroup)>) refuses the kernel.

The sizes are read from the kernel's text as compiled: the slot form and
the gas form (gpu/group, gpu/wgsl/wgsl_gas.py) add no workgroup variable.
A variable kem cannot size is refused where the entry uses it: a guess
could let a kernel over the limit reach the GPU.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kem_port.errors import KemError, bad_args
from kem_port.gpu.constants import known_ints, resolved
from kem_port.gpu.wgsl.wgsl_counts import count_value
from kem_port.gpu.wgsl.wgsl_calls import names_reached
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint, KernelShape
from kem_port.gpu.wgsl.wgsl_canonical import token_values
from kem_port.gpu.wgsl.wgsl_workgroup import workgroup_templates
from kem_port.gpu.wgsl.wgsl_workgroup_bytes import workgroup_bytes

STORAGE_LIMIT = "max-compute-workgroup-storage-size"
_NAME = re.compile(r"[A-Za-z_]\w*")


def check_workgroup_limits(entry: EntryPoint | None, limits, text: str | None = None, shape: KernelShape | None = None,
                           given: tuple[tuple[str, int | float], ...] | None = None) -> None:
    """The entry point's workgroup within the device's limits: its size
    and, given the kernel's text, its workgroup memory with the call's
    constants (given) over the kernel's shape."""
    _check_size(entry, limits)
    if entry is not None and text is not None and shape is not None:
        _check_storage(entry.name, limits, text, shape, given)


def _check_size(entry: EntryPoint | None, limits) -> None:
    if entry is None or entry.workgroup_size is None:
        return
    x, y, z = entry.workgroup_size
    caps = [int(limits.get(f"max-compute-workgroup-size-{axis}", 0)) for axis in "xyz"]
    total = int(limits.get("max-compute-invocations-per-workgroup", 0))
    over = [f"{axis} {size} > {cap}" for axis, size, cap in zip("xyz", (x, y, z), caps) if cap and size > cap]
    if total and x * y * z > total:
        over.append(f"{x}x{y}x{z} = {x * y * z} invocations > {total}")
    if over:
        raise bad_args(f"@workgroup_size({entry.workgroup_size_text}) is ({x}, {y}, {z}): over this device's limits ({'; '.join(over)})")


def _check_storage(entry: str, limits, text: str, shape: KernelShape, given: tuple[tuple[str, int | float], ...] | None) -> None:
    limit = int(limits.get(STORAGE_LIMIT, 0))
    if not limit or "workgroup" not in text:
        return
    variables = _used_sizes(text, entry)
    if variables is None:
        raise KemError("bad_kernel", "a var<workgroup> declaration kem cannot read (write it var<workgroup> NAME: TYPE;) "
                                     f"to hold the workgroup's memory to this device's limit of {limit} bytes")
    if not variables:
        return
    values = known_ints(shape, resolved(shape, given)) if shape.overrides else {}
    total, parts, named = 0, [], False
    for name, size_text in variables:
        size = count_value(size_text, values) if size_text is not None else None
        if size is None or size < 0:
            raise KemError("bad_kernel", f"var<workgroup> {name}: kem cannot read its size in bytes to hold the workgroup's "
                                         f"memory to this device's limit of {limit} bytes; write its type with literal, "
                                         "const or override counts of scalars, vectors, matrices, atomics, arrays and structs")
        size = -(-size // 16) * 16
        total += size
        parts.append(f"{name} {size}")
        named = named or any(n in values for n in _NAME.findall(size_text))
    if total > limit:
        detail = (f"entry point {entry} uses {total} bytes of var<workgroup> memory ({', '.join(parts)}; each rounded up "
                  f"to 16 bytes), over this device's limit of {limit} bytes (maxComputeWorkgroupStorageSize)")
        raise bad_args(f"constants: {detail}") if named else KemError("bad_kernel", detail)


def _used_sizes(text: str, entry: str) -> tuple[tuple[str, str | None], ...] | None:
    """(name, size text) of the workgroup variables entry uses: all of
    them where kem cannot tell which it uses; None where the kernel has a
    declaration kem did not read (naga also takes var<(workgroup)> and
    var<workgroup,>: 64 KiB ran uncounted, red team 9)."""
    found = _kernel_sizes(text)
    if found is None:
        return None
    sizes, reached = found
    used = reached.get(entry)
    return tuple((name, size) for name, size in sizes if used is None or name in used)


@lru_cache(maxsize=32)  # texts of up to 1 MiB (KEM_MAX_KERNEL_BYTES): 32 MiB at worst
def _kernel_sizes(text: str) -> tuple[tuple[tuple[str, str | None], ...], dict[str, frozenset[str]]] | None:
    """Each workgroup variable's size text, and the variables each function
    reaches (wgsl_calls.names_reached): read once per kernel text, whatever
    entry point or constants set a call names."""
    sizes = workgroup_bytes(text)
    try:
        values = token_values(text)
    except KemError:
        return None
    if workgroup_templates(values) != len(sizes):
        return None
    return sizes, names_reached(values, frozenset(name for name, _ in sizes))
