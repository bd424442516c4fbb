"""The lone hot call, folded: from a frame's bytes to its reply's one write
in as few Python calls as the road allows.

Nearly every lone call the node sends is ``{call, ReqId, execute_kernel,
{KernelId, Input, Hint}, TimeoutMs}`` with a small input, to a compiled
kernel whose lone kit is built (gpu/lone_kit.py), while the GPU thread is
idle. Today's road for it (router, protocol.hot_execute_kernel,
intake.submit, inline_call, GpuLoop.run_inline, Executor.run_lone,
LoneRoad.run, the reply's closures, FrameWriter) is ~40 Python calls
besides the kit's, and on a GPU host each costs ~1 us: the driver's
submit and wait leave the caches cold (docs/benchmarks.md, "The reader's
Python after the GPU wait"). Here the same steps, the same checks in the
same order, run in one method:

1. the frame's fields (request_fast.execute_kernel_fields) within the
   limits protocol.hot_execute_kernel checks; a frame they do not take
   goes back to the router (False), whose road gives the exact refusal;
2. the budget's own test (budget.py, ``take``);
3. nothing waiting in the pipe, the executor's lock free, nothing queued
   (inline_call.may_run_inline, GpuLoop.run_inline);
4. the kernel file, stat'ed every call (an edited kernel takes effect at
   once), and its admission (one dict lookup, admission/guard.py);
5. the call on its kit (LoneRoad.run_known), call_state answering
   ``running`` meanwhile (GpuLoop.inline_tag); the reply framed here and
   written with one ``os.write``; the counters under one lock.

Anything else (a larger call, no kit built for the shape, a kernel to
fetch or admit, the GPU thread busy, a frame waiting, the budget full)
leaves before anything is done and takes today's road from intake.submit
on, with the fields already read: every refusal is today's, in today's
order. A kit's failure is answered by today's rules (Executor.run_lone's).

**The budget.** A call here takes no share: shares are taken only on the
reader (intake.submit, submit_group), which runs nothing else until this
call is answered, so a share held meanwhile could refuse no one and no
one could see it (``stats`` is answered on the reader too). The refusal
test is budget.take's, read without its lock: other threads only give
shares back, so a stale read can only send a call to today's road, where
take decides under the lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic
from typing import Any

from kem_port.wire import log_frames
from kem_port.port.budget import WorkBudget
from kem_port.errors import KemError
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import lone_failed
from kem_port.port.gpu_loop import SMALL_CALL
from kem_port.kernel_store import KernelSource
from kem_port.wire.protocol import KERNEL_ID_BYTES, MAX_REQ_ID
from kem_port.wire.request_fast import execute_kernel_fields
from kem_port.wire.terms import ok_binary_frame

log = logging.getLogger("kem_port.lone_fold")

_COUNTED = (("calls", 1), ("inline_calls", 1))  # the reader's counters, in the kit's one stats update
_INTERNAL = "internal error (details in the node's log)"


class LoneFold:
    """The folded road of one Router; see the module doc."""

    def __init__(self, router: Any, input_waiting: Callable[[], object]) -> None:
        """Its parts taken once from the Router (router.py; not imported: it imports this)."""
        config, intake, loop, executor = router.config, router.intake, router.loop, router.executor
        self.max_input, self.max_output = config.max_input_bytes, config.max_output_bytes
        self.stats, self.intake, self.executor, self.reply_error = router.stats, intake, executor, router.reply_error
        self.budget: WorkBudget = intake.budget
        self.stores = router.resolver.local
        guard = intake.guard
        self.admitted: dict | None = guard.admitted if guard is not None else None
        self.loop, self.lock, self.queued = loop, loop.executor_lock, loop.queue.queue
        self.lone = executor.lone
        self.write_one, self.input_waiting = router.writer.write_one, input_waiting

    def __call__(self, frame: bytes) -> bool:
        """Answer (or hand to today's road) a hot execute_kernel frame: True;
        False for any other frame, nothing done (the router reads it)."""
        fields = execute_kernel_fields(frame)
        if fields is None:
            return False
        req_id, kernel_id, data, hint, timeout_ms = fields
        size = len(data)
        out = size * hint
        if not (req_id <= MAX_REQ_ID and 0 < timeout_ms <= MAX_REQ_ID and 0 < hint <= self.max_output
                and size <= self.max_input and out <= self.max_output and KERNEL_ID_BYTES.fullmatch(kernel_id)):
            return False  # the router's road refuses it, exactly
        kernel_id = kernel_id.decode("ascii")
        budget, lock = self.budget, self.lock
        calls = budget.calls
        if not (0 < out <= SMALL_CALL and size <= SMALL_CALL and calls < budget.max_calls
                and not (calls and budget.bytes + max(out, size) > budget.max_bytes)
                and not self.input_waiting() and lock.acquire(blocking=False)):
            return self._today(req_id, kernel_id, data, out, timeout_ms)
        source = result = failed = None
        try:
            if not self.queued:
                try:  # the kernel's local source, admitted: anything else is today's road's to decide
                    for store in self.stores:
                        source = store.lookup(kernel_id)  # its os.stat: an edited kernel takes effect at once
                        if source is not None:
                            break
                    if source is not None and self.admitted is not None:
                        source = self.admitted.get((source.sha256, "main", False))
                except Exception:  # today's road meets it again, as it always has
                    source = None
                if source is not None:
                    self.loop.inline_tag = req_id
                    try:
                        result = self.lone.run_known((source.sha256, "main", size, out, -1), data)
                    except Exception as exc:  # answered under the lock: a lost device is rebuilt there
                        failed = exc
                        self._failed(self._job(req_id, kernel_id, data, out, source), exc)
        finally:
            self.loop.inline_tag = None
            lock.release()
        if failed is not None:
            self.stats.bump(_COUNTED)
            return True
        if result is None:
            return self._today(req_id, kernel_id, data, out, timeout_ms)
        try:
            self.write_one(ok_binary_frame(req_id, result))
        except Exception:  # as today's road: logged, the caller's timer answers it
            log.exception("lone call failed")
            self.stats.bump(_COUNTED)
            return True
        self.lone.count_known(_COUNTED)
        return True

    def _today(self, req_id: int, kernel_id: str, data: bytes, out: int, timeout_ms: int) -> bool:
        """Today's road from intake.submit on, as the router takes a hot call."""
        timeout_s = timeout_ms / 1000.0
        try:
            self.intake.submit(req_id, KernelCall(kernel_id, data, out), monotonic() + timeout_s, timeout_s)
        except KemError as exc:
            self.reply_error(req_id, exc)
        except Exception:  # never let one request take the port down
            log.exception("internal error")
            self.reply_error(req_id, KemError("internal", _INTERNAL))
        self.stats.count_on_reader("calls")
        return True

    def _failed(self, job: Job, exc: Exception) -> None:
        """A kit's failure, by the executor's lone-call rules (a lost device
        is rebuilt, its kits go too)."""
        lone_failed(self.executor, job, exc)

    def _job(self, req_id: int, kernel_id: str, data: bytes, out: int, source: KernelSource | None) -> Job:
        """A job for a failed call, answered by today's rules (its refusal as inline_call's)."""

        def refuse(error: KemError) -> None:
            log_frames.kernel_failed(kernel_id, error)
            self.reply_error(req_id, error)

        return Job(KernelCall(kernel_id, data, out), source, reply=lambda view: None, fail=refuse, tag=req_id)  # type: ignore[arg-type]
