"""How many workgroups a call gets (docs/dispatch.md explains the rule).

1. ``workgroups`` given by the caller: used as is, after a limit check;
   or **grid**: ``grid`` invocations given by the caller, divided by the
   workgroup size rounding up (as hosts do), each dimension checked
   against the device's limit. Never both (bad_args).
2. **image**: a 2-D workgroup (y > 1, z = 1) whose params begin with an
   image's width and height (gpu/contract.image_params): ``p0 x p1``
   pixels, ``(ceil(p0/wx), ceil(p1/wy), 1)``, refused when ``p0 * p1``
   exceeds the output's size in bytes.
3. **1-D**: a 1-D workgroup (y = z = 1): one invocation per output
   element, counted in the output array's own elements (2 bytes an f16,
   16 a vec4<f32>; 4 where the type is not known):
   ``ceil(ceil(output_size / stride) / wx)`` groups in x. Past the
   per-dimension limit the groups spill into y, which only a kernel that
   declares ``@builtin(num_workgroups)`` can flatten; any other kernel is
   refused rather than run on part of its output.

Any other kernel gets no default: a 2-D or 3-D workgroup that the image
rule does not fit is refused with a ``bad_args`` that names the rules and
asks for ``workgroups``, never run on a guess (issue 25: a 16x16
transpose under the 1-D rule computed 768 of 3,072 outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint


@dataclass(frozen=True)
class DispatchLimits:
    max_per_dimension: int = 65535


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan_dispatch(
    entry: EntryPoint | None,
    output_size: int,
    param_words: tuple[int, ...],
    workgroups: tuple[int, int, int] | None,
    limits: DispatchLimits,
    grid: tuple[int, int, int] | None = None,
) -> tuple[int, int, int]:
    top = limits.max_per_dimension
    if grid is not None:
        if workgroups is not None:
            raise bad_args("give grid (invocations) or workgroups, not both")
        return _grid(entry, grid, top)
    if workgroups is not None:
        if any(g > top for g in workgroups):
            raise too_large(f"workgroups {workgroups} exceed the device's {top} per dimension")
        return workgroups
    wx, wy, wz = _size(entry, "its dispatch rules need it as integer literals or overrides; pass workgroups")
    if wy > 1 or wz > 1:
        return _image(entry, output_size, param_words, top)
    return _one_d(entry, output_size, top)


def rule_of(entry: EntryPoint | None, workgroups: tuple[int, int, int] | None,
            grid: tuple[int, int, int] | None = None) -> str:
    """The name of the rule that sizes a call's dispatch (kem check, docs/dispatch.md)."""
    if grid is not None:
        return "grid"
    if workgroups is not None:
        return "workgroups"
    if entry is None or entry.workgroup_size is None:
        return "none: workgroups required"
    _, wy, wz = entry.workgroup_size
    if wy == 1 and wz == 1:
        return "1-D"
    return "image" if wz == 1 and entry.image_params else "none: workgroups required"


def _size(entry: EntryPoint | None, why: str) -> tuple[int, int, int]:
    """The entry point's workgroup size, or bad_kernel: kem cannot read it (why it needs it)."""
    if entry is None or entry.workgroup_size is None:
        shown = entry.workgroup_size_text if entry else "?"
        raise KemError("bad_kernel", f"kem cannot read @workgroup_size({shown}): {why}")
    return entry.workgroup_size


def _grid(entry: EntryPoint | None, grid: tuple[int, int, int], top: int) -> tuple[int, int, int]:
    size = _size(entry, "a grid is divided by it, so it must be integer literals or overrides; pass workgroups")
    groups = tuple(_ceil_div(n, w) for n, w in zip(grid, size))
    if any(g > top for g in groups):
        raise too_large(
            f"grid {grid} at @workgroup_size{entry.workgroup_size} needs {groups} workgroups; "
            f"the device allows {top} per dimension"
        )
    return groups  # type: ignore[return-value]


def _image(entry: EntryPoint, output_size: int, param_words: tuple[int, ...], top: int) -> tuple[int, int, int]:
    wx, wy, wz = entry.workgroup_size
    if not (wz == 1 and entry.image_params and len(param_words) >= 2):
        raise bad_args(
            f"no default dispatch fits @workgroup_size({wx}, {wy}, {wz}): the 1-D rule covers 1-D workgroups, "
            "and the image rule 2-D ones whose params begin width, height (u32); pass grid => {X, Y, Z} (invocations) "
            "or workgroups => {X, Y, Z} "
            "(docs/dispatch.md)"
        )
    pixels = param_words[0] * param_words[1]
    if pixels > max(output_size, 1):
        # Params are the caller's word: an image larger than its output
        # would dispatch work without bound (every pixel past the output
        # reads and writes out of range). One pixel per output byte at most.
        raise too_large(
            f"params describe a {param_words[0]}x{param_words[1]} image, more pixels than the output has bytes ({output_size})"
        )
    groups = (_ceil_div(param_words[0], wx), _ceil_div(param_words[1], wy), 1)
    if groups[0] > top or groups[1] > top:
        raise too_large(f"image {param_words[0]}x{param_words[1]} needs {groups[:2]} workgroups; the device allows {top} per dimension")
    return groups


def _one_d(entry: EntryPoint, output_size: int, top: int) -> tuple[int, int, int]:
    wx = entry.workgroup_size[0]
    elements = _ceil_div(output_size, entry.output_stride or 4)
    groups_needed = _ceil_div(elements, wx)
    if groups_needed <= top:
        return (groups_needed, 1, 1)
    if "num_workgroups" not in entry.builtins:
        raise KemError(
            "dispatch_too_large",
            f"{elements} elements need {groups_needed} workgroups, over the device's {top} in x; "
            "kem spills into y only for kernels that declare @builtin(num_workgroups) "
            "and flatten the index (docs/dispatch.md); or pass workgroups",
        )
    gy = _ceil_div(groups_needed, top)
    if gy > top:
        raise too_large(f"{groups_needed} workgroups exceed {top} x {top}")
    return (top, gy, 1)
