"""A group job of a call-table kernel in ONE dispatch (docs/dispatch.md,
"A group of a call-table kernel"; docs/executor.md, "Group jobs").

Only for a kernel the operator lists (call_table.Sharing): a call-table
kernel reads every row of its dispatch, so an unlisted kernel's group is
cut into one-slot chunks (``chunk_slots``), each bound to its own slot.

A group's N slots are already packed at a fixed stride (input_upload.pack_slots:
slot k's input at ``k * in_stride`` from the group's input offset), so its
call table is arithmetic, built with numpy in one go: row k is
``(k * in_stride / 4, ceil(S / 4), k * out_words, out_words)``, the
outputs back to back (slot k's at ``k * out_size`` bytes from the group's
output offset, which is the group's ``out_stride``). The group shares the
dispatch of the batch's other calls to its kernel (plan.TableGroup, rows
by ``shared_rows``): bound once, dispatched once, one invocation per
output word; its live slots' outputs are gathered as a plain group's are
(group_stage.gather).

A group larger than one dispatch allows (the binding limit, or one row of
workgroups: a shared dispatch does not spill into y, as for single calls)
is cut into chunks of C slots, each its own binding and dispatch; C is a
multiple of what keeps each chunk's output offset aligned for binding, so
the chunks' outputs still sit back to back and the gather is unchanged.
Where no such C exists (fewer slots fit one dispatch than the alignment
asks for), or its calls are larger than ``call_table.MAX_CALL_BYTES``
(a table buys them nothing), the group goes as its single calls
(``chunk_slots`` returns 0; executor._prepare_all splits it).

Per group this replaces N bind groups, N ``set_bind_group`` + dispatch
pairs and N calls through ``call_table.build`` by a share of one: the
slot loop was 8-9 us a call of the GPU thread at 64 slots on the H100.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from kem_port.gpu.group import call_table
from kem_port.gpu import contract
from kem_port.gpu.pipelines import Pipeline

if TYPE_CHECKING:
    from kem_port.gpu.device import Device

# An `item` here is a plan.Prepared (plan.py imports this module, so it is
# not imported back: kem_port's import graph has no cycles).


def fits(item, gpu: Device, shared: bool) -> bool:
    """Whether a group item of a call-table kernel runs on its own table
    (one dispatch, or a few chunks of it) on `gpu` rather than as its
    single calls. `shared`: its kernel may share a dispatch across callers
    (call_table.Sharing); else each slot is a chunk of its own."""
    return chunk_slots(item, gpu.storage_align, gpu.binding_limit, gpu.dispatch_limits.max_per_dimension, shared) > 0


def chunk_slots(item, storage_align: int, binding_limit: int, max_groups: int, shared: bool = True) -> int:
    """Slots per dispatch for a group item of a call-table kernel (the
    whole group when it fits one), or 0: it goes as its single calls. A
    kernel not shared across callers gets one slot a dispatch: its table
    one row, its bound input and output exactly that slot's."""
    call = item.job.call
    if not call_table.coalescible(len(call.input), call.output_size):
        return 0
    in_stride = contract.align(item.in_size, storage_align)
    out_size, out_words = item.out_size, item.out_size // 4
    width = item.pipeline.entry.workgroup_size[0]
    fit = min(
        (binding_limit - item.in_size) // in_stride + 1,  # the chunk's input span
        binding_limit // out_size,  # its outputs, back to back
        binding_limit // call_table.ROW_BYTES,  # its rows
        max_groups * width // out_words,  # one row of workgroups
    )
    if not shared:
        return min(fit, 1)
    if fit >= item.job.calls:
        return item.job.calls
    # A chunk's outputs must end where the next chunk's binding may start.
    step = storage_align // math.gcd(out_size, storage_align)
    return fit // step * step


@dataclass
class SlotTable:
    """One dispatch over slots [first, first + count) of a group item too
    large for one: plan.TableGroup's fields, so the batch binds and
    dispatches both alike."""

    pipeline: Pipeline
    item: object  # the group job's plan.Prepared
    first: int
    count: int
    out_stride: int  # the item's: out_size when chunks' outputs sit back to back
    in_offset: int = 0
    in_bytes: int = 0
    out_offset: int = 0
    out_bytes: int = 0
    table_offset: int = 0
    rows: bytes = b""
    words: int = 0

    @property
    def items(self) -> list:
        return [self.item]

    @property
    def calls(self) -> int:
        return self.count

    @property
    def alone(self) -> bool:
        return False  # dispatched over its words, as any shared dispatch

    def lay_out(self, out_start: int, table_start: int) -> None:
        """Outputs from out_start (the first chunk's is the item's), rows from table_start."""
        item = self.item
        if self.first == 0:
            item.out_offset, item.out_stride = out_start, self.out_stride
        self.in_offset = item.in_offset + self.first * item.in_stride
        self.in_bytes = (self.count - 1) * item.in_stride + item.in_size
        out_words = item.out_size // 4
        self.out_offset, self.out_bytes, self.words = out_start, self.count * item.out_size, self.count * out_words
        self.table_offset = table_start
        self.rows = slot_rows(self.count, item.in_stride // 4, -(-len(item.job.call.input) // 4), out_words)


def slot_tables(item, chunk: int, storage_align: int) -> list[SlotTable]:
    """A group item's dispatches, `chunk` slots each (the last one the rest).
    Chunks of several slots hold a multiple of what keeps their outputs
    back to back on the binding alignment (chunk_slots); one-slot chunks
    have each output on its own aligned start, so slots sit that far apart."""
    calls = item.job.calls
    stride = item.out_size if chunk > 1 else contract.align(item.out_size, storage_align)
    return [SlotTable(item.pipeline, item, first, min(chunk, calls - first), stride) for first in range(0, calls, chunk)]


@lru_cache(maxsize=64)
def slot_rows(count: int, in_stride_words: int, input_words: int, out_words: int) -> bytes:
    """The rows of `count` slots: inputs at a stride, outputs back to back.
    Cached: under steady traffic every group of a kernel has the same ones."""
    slot = np.arange(count, dtype=np.uint32)
    rows = np.empty((count, 4), "<u4")
    rows[:, 0] = slot * np.uint32(in_stride_words)
    rows[:, 1] = input_words
    rows[:, 2] = slot * np.uint32(out_words)
    rows[:, 3] = out_words
    return rows.tobytes()


def input_end(item) -> int:
    """Where an item's inputs end in the batch's input buffer (a group's last slot's)."""
    return item.in_offset + (item.job.calls - 1) * item.in_stride + item.in_size


def shared_rows(items: list, in_base: int, out_start: int) -> tuple[bytes, int]:
    """The rows of single calls and whole groups sharing one dispatch, in
    order, outputs back to back from out_start (each item's out_offset set;
    a group's slots out_size apart). Returns the rows and the output words."""
    parts, word = [], 0
    for item in items:
        in_word, out_words, in_words = (item.in_offset - in_base) // 4, item.out_size // 4, -(-len(item.job.call.input) // 4)
        item.out_offset = out_start + word * 4
        if item.job.calls == 1:
            parts.append(call_table.ROW.pack(in_word, in_words, word, out_words))
            word += out_words
            continue
        item.out_stride = item.out_size
        rows = np.frombuffer(slot_rows(item.job.calls, item.in_stride // 4, in_words, out_words), "<u4").reshape(-1, 4)
        parts.append((rows + np.array([in_word, 0, word, 0], "<u4")).tobytes())
        word += item.job.calls * out_words
    return b"".join(parts), word
