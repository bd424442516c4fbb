"""Which calls a stuck GPU may be blamed on (``call_state``; kem_timeout.erl
quarantines a kernel and kills its port only when the port says the GPU
is inside that very call).

A batch runs many callers' calls in one submission, so "running" must not
mean "somewhere in the batch the GPU is stuck in". WGSL has no recursion:
only a loop statement lets a small dispatch run long
(gpu/wgsl_calls.may_loop). So

- a kernel that may loop is batched only with calls of the same kernel
  and entry point (:func:`loop_key`): a batch that holds a runaway holds
  nothing but calls to the runaway's kernel, and blaming that kernel is
  right whichever of its calls ran away;
- while the GPU thread waits on the batch in flight, the next batch it has
  encoded is not yet submitted (Executor.step submits it only after the
  wait), so its calls are queued, not running (:class:`OnGpu`).

Before, a runaway batched beside an innocent `double` call got `double`
quarantined and the port killed when the innocent call's timer fired
first (second red team, issue 24).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kem_port.gpu.calls import Job
from kem_port.gpu.wgsl.wgsl_calls import may_loop


def loop_key(job: Job) -> tuple[str, str] | None:
    """None for a kernel that cannot loop (it may share any batch), else the
    (kernel sha256, entry point) it may share a batch with. One dict lookup
    once the kernel's entry was parsed (may_loop keeps its answers)."""
    source, entry = job.source, job.call.entry_point
    return (source.sha256, entry) if may_loop(source.text, source.sha256, entry) else None


@dataclass
class OnGpu:
    """What the GPU thread is inside: the batch it waits on (submitted,
    running) and the one encoded behind it (not yet submitted)."""

    older: list[Job] = field(default_factory=list)
    newer: list[Job] = field(default_factory=list)

    def where(self, tag: object) -> tuple[str, int] | None:
        """("running", 0), ("queued", calls ahead) or None for the call tagged `tag`."""
        if any(job.has_tag(tag) for job in self.older):
            return "running", 0
        if any(job.has_tag(tag) for job in self.newer):
            return "queued", sum(job.calls for job in self.older)
        return None
