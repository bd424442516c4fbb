"""The wire side of a group job (gpu/group_job.py): how its slots' answers
and refusals reach their callers, and give back their share of the budget.

Built on the reader (intake.py) and run on the GPU thread, outside gpu/:
the live slots' outputs arrive as one blob, and go out as ``{replies,
Index, Blob}`` frames (batch_frames.uniform_replies_frame: the Index built
with numpy, the blob not copied), or as a lone reply when one slot is left.
"""

from __future__ import annotations

import time

import numpy as np

from kem_port.wire import log_frames
from kem_port.wire.batch_frames import uniform_replies_frame
from kem_port.port.budget import WorkBudget
from kem_port.errors import KemError
from kem_port.wire.framing import REPLIES_BYTES, REPLIES_CALLS
from kem_port.port.replies import Replies
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.group.group_job import GroupJob
from kem_port.wire.group_frames import Group
from kem_port.kernel_store import KernelSource


def group_job(group: Group, call: KernelCall, source: KernelSource, share: int, budget: WorkBudget,
              replies: Replies) -> GroupJob:
    """One job for a group's calls (intake.py): its slots answered through
    GroupAnswers, each with its own deadline (TimeoutMs 0: none)."""
    answers = GroupAnswers(group.kernel_id, group.entries["req_id"], group.output_size, share, budget, replies)
    timeouts = group.entries["timeout_ms"]
    deadlines = np.where(timeouts > 0, time.monotonic() + timeouts / 1000.0, np.inf)
    return GroupJob(call=call, source=source, inputs=group.inputs, slot_tags=group.req_ids, deadlines=deadlines,
                    live=np.ones(group.n, bool), reply_slots=answers.reply_slots, fail_slots=answers.fail_slots)


class GroupAnswers:
    def __init__(self, kernel_id: str, req_ids: np.ndarray, output_size: int, share: int, budget: WorkBudget,
                 replies: Replies) -> None:
        self.kernel_id, self.req_ids, self.output_size = kernel_id, req_ids, output_size
        self.share, self.budget, self.replies = share, budget, replies
        # Results per replies frame: within the node's 1 MiB and 256 (framing.py).
        self.per_frame = max(1, min(REPLIES_CALLS, REPLIES_BYTES // output_size))

    def reply_slots(self, blob: memoryview, slots: np.ndarray) -> None:
        """The outputs of `slots`, back to back in `blob`, to their callers."""
        self.budget.give_many(len(slots), len(slots) * self.share)
        req_ids, size, step = self.req_ids[slots], self.output_size, self.per_frame
        blob = memoryview(blob)
        for start in range(0, len(slots), step):
            chunk = req_ids[start : start + step]
            data = blob[start * size : (start + len(chunk)) * size]
            if len(chunk) == 1:
                self.replies.write_result(int(chunk[0]), data)
            else:
                self.replies.write(uniform_replies_frame(chunk, size, data))

    def fail_slots(self, slots: np.ndarray, error: KemError) -> None:
        """Each of `slots` hears `error` on its own."""
        self.budget.give_many(len(slots), len(slots) * self.share)
        log_frames.kernel_failed(self.kernel_id, error)
        for req_id in self.req_ids[slots].tolist():
            self.replies.error(req_id, error)
