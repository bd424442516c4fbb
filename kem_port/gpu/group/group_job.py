"""N calls to one kernel with one input size, as ONE job (a group frame,
docs/protocol.md "Group frames"; docs/executor.md "Group jobs").

The reader checks, budgets, resolves and admits a group once and queues one
GroupJob; the GPU thread prepares it once (its ``call`` is the first slot's
call: every slot has the same kernel, sizes and so the same checks,
pipeline and dispatch), packs its N inputs into N slots of the batch's
input buffer with one numpy copy, dispatches once per slot (the only
per-call loop) and answers the slots still live with one blob of their
outputs back to back. How the answers reach the wire is the caller's
(``reply_slots``, ``fail_slots``: built outside gpu/).

Each slot keeps its own deadline: a slot whose deadline passes while the
group is queued is failed alone (``expire``) and not dispatched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kem_port.errors import KemError
from kem_port.gpu.calls import Job, KernelCall

# reply_slots(blob, slots): the outputs of `slots` (indexes into the group),
# back to back in that order; fail_slots(slots, error).
ReplySlots = Callable[[memoryview, np.ndarray], None]
FailSlots = Callable[[np.ndarray, KemError], None]


def _unused(*_: object) -> None:  # a GroupJob answers through reply_slots/fail_slots
    raise AssertionError("a GroupJob is answered by slot")


@dataclass(eq=False)
class GroupJob(Job):
    reply: Callable = _unused
    fail: Callable = _unused
    inputs: bytes | memoryview = b""  # calls * len(call.input) bytes
    slot_tags: list = field(default_factory=list)  # each slot's caller id (call_state.py)
    deadlines: np.ndarray = field(default_factory=lambda: np.empty(0))  # per slot; inf: none
    live: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # slots still to answer
    reply_slots: ReplySlots = _unused
    fail_slots: FailSlots = _unused

    def __post_init__(self) -> None:
        self.calls = len(self.live)
        self._update_deadline()

    def has_tag(self, tag: object) -> bool:
        return tag in self.slot_tags  # call_state only: a scan, not a set made per group

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.live)

    def expire(self, now: float, error: KemError) -> None:
        """Fail the live slots whose deadline passed; the group is answered
        when none is left."""
        gone = self.live & (self.deadlines < now)
        if not gone.any():
            return
        self.live &= ~gone
        self.fail_slots(np.flatnonzero(gone), error)
        if not self.live.any():
            self.answered = True
        self._update_deadline()

    def _update_deadline(self) -> None:
        remaining = self.deadlines[self.live]
        earliest = float(remaining.min()) if len(remaining) else np.inf
        self.deadline = None if earliest == np.inf else earliest

    def answer(self, view: memoryview) -> None:
        """`view`: the live slots' outputs back to back, in slot order."""
        if not self.answered:
            self.answered = True
            self.reply_slots(view, self.live_slots())

    def refuse(self, error: KemError) -> None:
        """The group failed as a whole: each live slot hears the same error."""
        if not self.answered:
            self.answered = True
            self.fail_slots(self.live_slots(), error)

    def split(self) -> list[Job]:
        """The live slots as plain jobs (a kernel the group cannot run as
        slots, such as a call-table kernel): each answers its own slot."""
        self.answered = True
        size = len(self.call.input)
        jobs = []
        for slot in self.live_slots().tolist():
            call = KernelCall(self.call.kernel_id, self.inputs[slot * size : (slot + 1) * size], self.call.output_size)
            deadline = float(self.deadlines[slot])
            jobs.append(Job(
                call=call, source=self.source, enqueued=self.enqueued,
                reply=lambda view, s=slot: self.reply_slots(view, np.array([s])),
                fail=lambda error, s=slot: self.fail_slots(np.array([s]), error),
                tag=self.slot_tags[slot], deadline=None if deadline == np.inf else deadline,
            ))
        return jobs
