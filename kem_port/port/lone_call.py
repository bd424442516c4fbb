"""A lone small kernel call run inline on the reader: whether it may, and
its run, from its typed request to its reply's one write.

Nearly every lone call the node sends is ``{call, ReqId, execute_kernel,
{KernelId, Input, Hint}, TimeoutMs}`` with a small input, to a compiled
kernel, while the GPU thread is idle. Handing it to the GPU thread cost
~400 us of a ~900 us call on lavapipe (docs/executor.md), and on a GPU
host each Python call after the driver's submit and wait costs ~1 us (the
caches are cold: docs/benchmarks.md, "The reader's Python after the GPU
wait"), so the call runs here, in as few Python calls as the road allows:

1. a small plain call (no explicit workgroups, no shared-memory result,
   no debug), the budget's own test (budget.py, ``take``), no frame
   waiting in the pipe, the executor's lock free, nothing queued;
2. the kernel file, stat'ed every call (an edited kernel takes effect at
   once), and its admission (one dict lookup, admission/guard.py);
3. a hot request (read by the narrow reader, wire/requests.py) whose
   shape's kit is built runs on it (LoneRoad.run_known: bare C-API calls,
   the reply framed here and written with one ``os.write``, the counters
   under one lock);
4. any other call whose pipeline is compiled and whose kernel cannot loop
   (gpu/wgsl/wgsl_calls.py: WGSL has no recursion, so only a loop can
   hold the reader long) takes the executor's lone road (GpuLoop.run_held:
   its shape's kit, built on the first call, else a batch of one).

call_state answers ``running`` meanwhile (GpuLoop.inline_tag). Anything
else leaves before anything is done (False) and the router hands the call
to intake.submit, where every refusal is given in its order. A failure on
the GPU is answered by the executor's rules (Executor.run_lone's).

**The budget.** A call here takes no share: shares are taken on the
reader (intake.submit, submit_group), which runs nothing else until this
call is answered, so a share held meanwhile could refuse no one and no
one could see it (``stats`` is answered on the reader too). The refusal
test is budget.take's, read without its lock. Other threads give shares
back, and one takes them: a named call that waited for a fetch or an
admission takes its share on its fetch thread (run_methods.py). So a
stale read either sends a call to intake's road, where take decides
under the lock, or lets this one small call run while that share arrives:
over the bound by one small call for the time it runs, never a queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kem_port.errors import KemError
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor, lone_failed
from kem_port.gpu.wgsl.wgsl_calls import may_loop
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.port.budget import WorkBudget
from kem_port.port.gpu_loop import SMALL_CALL, GpuLoop
from kem_port.port.intake import Intake
from kem_port.port.replies import Replies
from kem_port.stats import Stats
from kem_port.wire import log_frames
from kem_port.wire.request_types import KernelRequest
from kem_port.wire.terms import ok_binary_frame, ok_gas_frame

log = logging.getLogger("kem_port.lone_call")

_COUNTED = (("calls", 1), ("inline_calls", 1))  # the reader's counters, in the kit's one stats update


class LoneCall:
    """The reader's inline road for lone small calls; see the module doc."""

    def __init__(self, stats: Stats, intake: Intake, loop: GpuLoop, executor: Executor,
                 resolver: KernelResolver, replies: Replies, input_waiting: Callable[[], object]) -> None:
        self.stats, self.executor, self.replies = stats, executor, replies
        self.budget: WorkBudget = intake.budget
        self.stores = resolver.local
        guard = intake.guard
        self.admitted: dict | None = guard.admitted if guard is not None else None
        self.loop, self.lock, self.queued = loop, loop.executor_lock, loop.queue.queue
        self.lone = executor.lone
        self.write_one, self.input_waiting = replies.write_one, input_waiting

    def __call__(self, request: KernelRequest) -> bool:
        """Run the call inline and answer it: True; False with nothing
        done (the router takes it on from intake.submit)."""
        call = request.call
        data, out = call.input, call.output_size
        size = len(data)
        budget, lock = self.budget, self.lock
        calls = budget.calls
        if not (out <= SMALL_CALL and size <= SMALL_CALL and calls < budget.max_calls
                and not (calls and budget.bytes + max(out, size) > budget.max_bytes)
                and (request.hot or plain(call))
                and not self.input_waiting() and lock.acquire(blocking=False)):
            return False
        req_id = request.req_id
        result = failed = None
        ran = False
        try:
            source = None if self.queued else self._admitted_source(call)
            if source is not None:
                self.loop.inline_tag = req_id
                if request.hot:
                    try:
                        result = self.lone.run_known((source.sha256, "main", size, out, -1), data)
                    except Exception as exc:  # answered under the lock: a lost device is rebuilt there
                        failed = exc
                        lone_failed(self.executor, self._job(request, source), exc)
                if result is None and failed is None:
                    ran = self._run(request, source)
        finally:
            self.loop.inline_tag = None
            lock.release()
        if failed is not None or ran:
            self.stats.bump(_COUNTED)
            return True
        if result is None:
            return False
        try:
            self.write_one(ok_binary_frame(req_id, result) if not call.usage else ok_gas_frame(req_id, result, self.lone.known_gas()))
        except Exception:  # as intake's road: logged, the caller's timer answers it
            log.exception("lone call failed")
            self.stats.bump(_COUNTED)
            return True
        self.lone.count_known(_COUNTED)
        return True

    def _admitted_source(self, call: KernelCall) -> KernelSource | None:
        """The kernel's local source as admitted for this call, or None
        (a kernel to fetch or admit: intake's to decide)."""
        try:
            for store in self.stores:
                source = store.lookup(call.kernel_id)  # its os.stat: an edited kernel takes effect at once
                if source is not None:
                    if self.admitted is None:
                        return source
                    return self.admitted.get((source.sha256, call.entry_point, call.params is not None))
        except Exception:  # intake's road meets it again, as it always has
            return None
        return None

    def _run(self, request: KernelRequest, source: KernelSource) -> bool:
        """A call with no kit built (or not hot) on the executor's lone
        road, when it cannot hold the reader long; False, nothing done, if not."""
        call = request.call
        if not self.executor.is_warm(source, call) or may_loop(source.text, source.sha256, call.entry_point):
            return False
        self.loop.run_held(self._job(request, source))
        return True

    def _job(self, request: KernelRequest, source: KernelSource) -> Job:
        """The call as a job answered through the port's replies."""
        req_id, call, replies = request.req_id, request.call, self.replies

        def answer(view: memoryview) -> None:
            replies.result(req_id, call, view, job.gas)  # gas: a usage call's, set by its road

        def refuse(error: KemError) -> None:
            log_frames.kernel_failed(call.kernel_id, error)
            replies.error(req_id, error)

        job = Job(call, source, answer, refuse, tag=req_id, deadline=request.deadline)
        return job


def plain(call: KernelCall) -> bool:
    """A call the reader may run: no explicit workgroup count or grid (a
    dispatch the caller sizes may be any length: red team, a grid call ran
    on the reader), no shared-memory result, no debug records (those run
    one at a time on the GPU thread, debug_calls.py)."""
    return call.workgroups is None and call.grid is None and call.output_path is None and not call.debug
