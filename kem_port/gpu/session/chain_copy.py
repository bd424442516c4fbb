"""Copy and clear steps, checked before anything is submitted.

They run as the GPU's own copy commands (``copy_buffer_to_buffer``,
``clear_buffer``) between the chain's compute passes, not as kernels: the
bitonic sort of the WebGPU samples needed a hand-written copy kernel per
step (66 steps became 132 dispatches, issue 29).

WebGPU's rules, checked here so that a failure names the step instead of
coming back from wgpu as a validation error of the whole submission:
offsets and sizes are whole 4-byte words, every range lies inside its
buffer, and a copy's source and destination are two buffers (wgpu refuses
a copy within one buffer, overlapping or not: "Source and destination
cannot be the same buffer").
"""

from __future__ import annotations

from collections.abc import Callable

from kem_port.errors import bad_args
from kem_port.gpu.session.chain_steps import ClearStep, CopyStep, PlannedClear, PlannedCopy, Slot
from kem_port.gpu.session.sessions import check_word_multiple


def plan_copy(step: CopyStep, lookup: Callable[[str], Slot]) -> PlannedCopy:
    src, dst = lookup(step.src), lookup(step.dst)
    check_word_multiple(step.src_offset, "copy source offset")
    check_word_multiple(step.dst_offset, "copy destination offset")
    check_word_multiple(step.size, "copy size")
    _inside(src, step.src_offset, step.size, "copy source")
    _inside(dst, step.dst_offset, step.size, "copy destination")
    if src is dst:
        raise bad_args(f"copy from {_shown(src)} to itself: WebGPU copies between two buffers only "
                       "(copy through a second buffer, or use a kernel)")
    return PlannedCopy(src, step.src_offset, dst, step.dst_offset, step.size)


def plan_clear(step: ClearStep, lookup: Callable[[str], Slot]) -> PlannedClear:
    slot = lookup(step.buffer)
    check_word_multiple(step.offset, "clear offset")
    check_word_multiple(step.size, "clear size")
    _inside(slot, step.offset, step.size, "clear")
    return PlannedClear(slot, step.offset, step.size)


def _inside(slot: Slot, offset: int, size: int, what: str) -> None:
    """Within the bytes the buffer has (its whole words: a 6-byte temporary is bound as 8)."""
    if offset < 0 or size < 0 or offset + size > slot.size:
        raise bad_args(f"{what} range {offset}..{offset + size} is outside buffer {_shown(slot)} of {slot.size} bytes")


def _shown(slot: Slot) -> str:
    return repr(slot.name) if slot.name else "the chain's input"
