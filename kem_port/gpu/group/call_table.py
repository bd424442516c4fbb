"""Many calls, one dispatch: the call table ABI (docs/dispatch.md, "Many
calls in one dispatch").

A kernel opts in by declaring, beside its input (binding 0) and output
(binding 1), a read-only storage array at binding 3::

    struct KemCall { input_offset: u32, input_words: u32, output_offset: u32, output_words: u32 }
    @group(0) @binding(3) var<storage, read> kem_calls: array<KemCall>;

Small calls to such a kernel in one batch then become one dispatch: their
inputs packed in the bound input range, their outputs packed back to back
in the bound output range (call k's output starts where call k-1's ends),
one row per call in ``kem_calls``, ascending ``output_offset``. The
dispatch has one invocation per output word of all the calls together
(``arrayLength(&output_words)`` of them, flattened across ``x`` and ``y``
like any kem dispatch past the per-dimension limit); invocation ``i``
finds its call by a binary search of ``output_offset`` (the snippet in
docs/dispatch.md). Offsets and lengths are in 32-bit words from the start
of the bound ranges. A kernel without binding 3 keeps the plain contract,
one dispatch per call with its own bindings.

Why one flat dispatch rather than a row of workgroups per call: a 4-byte
call would keep one invocation of a 64-wide workgroup busy and 63 idle;
on lavapipe 4,096 such rows took 1.8 s against 87 ms for 4,096 separate
dispatches (scripts/bench_coalesce.py, first version). The search costs
log2(calls) reads of a table that stays in cache.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kem_port.gpu import contract
from kem_port.gpu.wgsl.wgsl_reflect import KernelShape

if TYPE_CHECKING:
    from kem_port.config import Config

CALL_TABLE_BINDING = contract.TABLE
ROW = struct.Struct("<4I")  # input_offset, input_words, output_offset, output_words
ROW_BYTES = ROW.size
MAX_CALL_BYTES = 256 * 1024  # larger calls dispatch alone: a table buys them nothing


@dataclass(frozen=True)
class Sharing:
    """Whose calls may share one dispatch (docs/dispatch.md, "Who sees
    what"). A call-table kernel sees every row of its dispatch by design,
    and the port cannot tell callers apart (a frame carries ReqIds only, and
    an Erlang caller has one call in flight), so calls of a kernel share a
    table only when the operator lists it (``shared_table_kernels``); any
    other gets one call per dispatch. The default lists none, not even kem's
    own double_table: issue 24 asks for no sharing unless the operator says
    so, and opting in is one line. ``cross_caller_dispatch=off`` shares
    nothing: no listed tables, and no slot form (executor).

    What it costs, and why it is paid: on an H100 (`scripts/bench full`,
    alternating with 71af1b6) an unlisted double_table lost 7-35% of its
    rows (64 x 64: 2.47-2.49M against 2.67-3.28M items/s; 256 x 1: 76-80k
    against 116k calls/s); listed, it was back to base. Before, 220 of 2,426
    attacker replies held a victim's secret: a kernel that can see every
    row may only see the rows of callers an operator vouched for it to."""

    cross_caller: bool = True
    table_kernels: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: Config) -> Sharing:
        return cls(config.cross_caller_dispatch == "on", frozenset(config.shared_table_kernels))

    def shares_table(self, kernel_id: str) -> bool:
        """Whether calls naming this kernel may share a dispatch. By the id
        the callers named, not the pipeline's: two ids of one text share a
        compiled pipeline, and an unlisted id's calls must not join a listed
        one's dispatch (tables are grouped by pipeline and id, plan.py)."""
        return self.cross_caller and kernel_id in self.table_kernels


NO_SHARING = Sharing(False)


def opts_in(shape: KernelShape) -> bool:
    """Whether the kernel declares the call table (read-only storage at binding 3)."""
    return contract.uses_call_table(shape)


@dataclass(frozen=True)
class Slot:
    """One call's input within the bound input range (bytes, word-aligned)
    and its output size; its output offset is the table's to decide."""

    input_offset: int
    input_bytes: int
    output_bytes: int


@dataclass(frozen=True)
class Table:
    """The rows of one coalesced dispatch and where each call's output lands."""

    rows: bytes
    output_offsets: tuple[int, ...]  # bytes from the start of the bound output range
    output_bytes: int  # the bound output range: every call's words, back to back
    items: int  # invocations that do work: one per output word


def coalescible(input_bytes: int, output_bytes: int) -> bool:
    """Small calls with some output coalesce; large ones dispatch alone."""
    return 0 < output_bytes <= MAX_CALL_BYTES and input_bytes <= MAX_CALL_BYTES


def build(slots: list[Slot]) -> Table:
    """The call table for calls to one kernel, outputs packed in order."""
    rows = bytearray(ROW_BYTES * len(slots))
    offsets = []
    word = 0
    for k, slot in enumerate(slots):
        if slot.input_offset % 4:
            raise ValueError("inputs must start on a word")
        out_words = -(-slot.output_bytes // 4)
        ROW.pack_into(rows, k * ROW_BYTES, slot.input_offset // 4, -(-slot.input_bytes // 4), word, out_words)
        offsets.append(word * 4)
        word += out_words
    return Table(bytes(rows), tuple(offsets), word * 4, word)


def workgroups(items: int, workgroup_x: int, max_groups: int) -> tuple[int, int, int]:
    """One invocation per item, spilling into y past the per-dimension limit
    (the kernel flattens with @builtin(num_workgroups), as docs/dispatch.md says)."""
    groups = max(-(-items // workgroup_x), 1)
    if groups <= max_groups:
        return (groups, 1, 1)
    return (max_groups, -(-groups // max_groups), 1)
