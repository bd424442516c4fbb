"""Debug calls (``debug => true``) on the GPU thread, answered with their
records: ``{ok, {Result, #{records => [u32], dropped => N, capacity => C}}}``
(docs/debug.md). They run one at a time between batches, as control
actions, so the batch path never sees the debug channel."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kem_port.errors import KemError, internal
from kem_port.gpu.calls import Job
from kem_port.gpu.debug_run import run_debug
from kem_port.gpu.executor import Executor
from kem_port.port.gpu_loop import GpuLoop, QueueFull

log = logging.getLogger("kem_port.debug_calls")


def enqueue(loop: GpuLoop, req_id: int, job: Job, answer: Callable[[tuple[bytes, dict]], None]) -> None:
    """Queue job's call in debug mode; answer((output, records)) or job.refuse(error)."""

    def run(executor: Executor) -> None:
        try:
            result = run_debug(executor, job)
        except KemError as exc:
            job.refuse(exc)
            return
        except Exception:  # answered, never left to time out
            log.exception("debug call failed")
            job.refuse(internal())
            return
        job.answered = True
        answer(result)

    run.tag = req_id  # type: ignore[attr-defined]  # call_state.py finds it
    try:
        loop.put(run)
    except QueueFull:
        raise KemError("overloaded", "the GPU queue is full") from None
