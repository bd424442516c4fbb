"""The ``run`` method: a kernel called by named buffers (issue 25).

Its kernel is resolved (a fetch on a fetch thread) and admitted as a
session kernel is (admission/guard.py: the same refusals, limits,
workgroup clearing and sacrificial compile, with the shader's own layout);
the call takes its share of the port's byte budget, runs on the GPU
thread as a control action between batches (tagged with its ReqId, so
call_state says queued or running), and is answered with its returned
buffers by name. On the reader only when it is as short as a lone kem@1.0 call
(NamedRuns.small): its dispatch is the caller's, and a 16-byte call with
workgroups {4096, 256, 1} held the reader 0.5 s on lavapipe (ping and
call_state unanswered meanwhile) before that bound.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from functools import partial
from collections.abc import Callable
from concurrent.futures import Executor as Threads

from kem_port.admission.guard import CompileGuard
from kem_port.errors import KemError, internal
from kem_port.gpu.executor import Executor
from kem_port.gpu.named.named_gas import NamedOutputs
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.port.budget import WorkBudget
from kem_port.port.call_state import CallStates
from kem_port.port.gpu_loop import GpuLoop, QueueFull
from kem_port.port.intake import Once
from kem_port.port.replies import Replies, with_gas
from kem_port.wire import terms
from kem_port.wire.run_requests import RunRequest

log = logging.getLogger("kem_port.run")


class RunMethods:
    def __init__(self, loop: GpuLoop, resolver: KernelResolver, fetchers: Threads, replies: Replies,
                 budget: WorkBudget, guard: CompileGuard | None, states: CallStates,
                 input_waiting: Callable[[], object]) -> None:
        self.loop, self.resolver, self.fetchers, self.replies = loop, resolver, fetchers, replies
        self.budget, self.guard, self.states, self.input_waiting = budget, guard, states, input_waiting

    def handle(self, request: RunRequest) -> None:
        """Queue the call (KemError raised to the router when refused at once)."""
        call = request.call
        source = self.resolver.resolve_local(call.kernel_id)
        if source is None and not self.resolver.needs_fetch(call.kernel_id):
            raise KemError("kernel_not_found", f"no kernel {call.kernel_id!r} on this node")
        admitted = self._admitted(source, call)
        if admitted is not None:
            self._queue(request, admitted, on_reader=True)
            return
        self.fetchers.submit(self.replies.answering, request.req_id,
                             lambda: self._queue(request, self._admit(request, source), on_reader=False))

    def _admitted(self, source: KernelSource | None, call) -> KernelSource | None:
        if source is None or self.guard is None:
            return source
        return self.guard.is_admitted_for_session(source, call.entry_point, call.constants, gas=True)

    def _admit(self, request: RunRequest, source: KernelSource | None) -> KernelSource:
        """On a fetch thread: the kernel fetched if need be, then put through the guard."""
        call, req_id = request.call, request.req_id
        if source is None:  # call_state says what the call waits for, as execute's calls do (intake.py)
            with self.states.waiting(req_id, "fetching", f"the gateways to deliver kernel {call.kernel_id}"):
                source = self.resolver.fetch(call.kernel_id, request.deadline)
        self.loop.executor.named.check_constants(source, call.constants)
        if self.guard is None:
            return source
        with self.states.waiting(req_id, "admitting", f"kernel {call.kernel_id} to compile in the guard"):
            return self.guard.admit_for_session(source, call.entry_point, call.constants, gas=True)

    def _queue(self, request: RunRequest, source: KernelSource, on_reader: bool) -> None:
        self.budget.take(request.call.batch_bytes)  # KemError overloaded: answered by the caller's `answering`
        run = NamedRun(request, source, self.replies, self.budget)
        # As short as a lone kem@1.0 call (NamedRuns.small: bounded work, no
        # loop): run on the reader when the GPU thread is idle, as that call
        # is; waking the GPU thread doubled a 4-byte call from Erlang on
        # lavapipe (1003 against 434 us p50, scripts/bench quick). Only on
        # the reader: the input poll is the reader's own (stdio_guard), and a
        # call that waited for a fetch or an admission gains nothing inline.
        try:
            inline = on_reader and not self.input_waiting() and self.loop.executor.named.small(source, request.call)
        except BaseException:  # the run never started: its share is ours to give back
            run.give_back()
            raise
        if inline and self.loop.run_control_inline(run):
            self.replies.stats.inc("inline_named_calls")
            return
        try:
            self.loop.put(run)
        except QueueFull:
            run.give_back()
            raise KemError("overloaded", "the GPU queue is full") from None


class NamedRun:
    """One queued call by named buffers, a control action of the GPU loop.
    Calls of one kernel and entry point queued behind each other share a
    gather key: the loop takes them together and runs them in one
    submission (gather, gpu/named/named_batch.py)."""

    __slots__ = ("request", "source", "replies", "give_back", "queued", "tag", "gather_key")

    def __init__(self, request: RunRequest, source: KernelSource, replies: Replies, budget: WorkBudget) -> None:
        self.request, self.source, self.replies = request, source, replies
        self.give_back = Once(partial(budget.give, request.call.batch_bytes))  # its budget share, given back once
        self.queued = time.perf_counter()
        self.tag = request.req_id  # call_state: queued or running (gpu_loop.state_of)
        self.gather_key = ("run", source.sha256, request.call.entry_point)

    def __call__(self, executor: Executor) -> None:
        NamedRun.gather(executor, [self])

    @staticmethod
    def gather(executor: Executor, runs: list[NamedRun]) -> None:
        """Answer each: a timeout for one whose deadline passed in the queue
        (as gpu_loop expires execute's jobs), else its outputs or error.
        Shares go back before a reply is written, as execute's and group
        calls' do: a caller that has its answer never sees its share held
        (a stats call right after the last reply read one share held, in CI)."""
        try:
            now, live = time.monotonic(), []
            for run in runs:
                deadline = run.request.deadline
                if deadline is not None and now > deadline:
                    run.give_back()
                    waited = (time.perf_counter() - run.queued) * 1000
                    run.replies.error(run.request.req_id, KemError(
                        "timeout", f"waited {waited:.0f} ms in the port's queue; the call's deadline passed before the GPU started it"))
                else:
                    live.append(run)
            try:
                results = executor.named.run_many([(run.source, run.request.call) for run in live]) if live else []
            except Exception:  # a bug must not leave a caller waiting
                log.exception("named calls failed")
                results = [internal()] * len(live)
            for run in live:
                run.give_back()
            # One writev for a batch's replies (a write each was 14% of a loaded
            # port's samples at 64 callers, lavapipe, py-spy); a lone call's goes
            # straight out (the context cost it ~4% of its port time, H100).
            with runs[0].replies.gathered() if len(live) > 1 else nullcontext():
                for run, result in zip(live, results):
                    req_id = run.request.req_id
                    if isinstance(result, KemError):
                        run.replies.error(req_id, result)
                    else:
                        run.replies.answering(req_id, lambda: _answer(run.replies, req_id, result, run.request.usage))
        finally:
            for run in runs:
                run.give_back()


def _answer(replies: Replies, req_id: int, outputs: NamedOutputs, usage: bool) -> None:
    """Names as binaries (a str key would become an atom on the node); with
    usage, the run's gas beside them (``{Outputs, #{gas => G}}``, docs/metering.md)."""
    if not usage:
        replies.write(terms.ok_named_reply(req_id, outputs))  # spliced, as the lone call's reply is
        return
    replies.ok(req_id, with_gas({name.encode(): data for name, data in outputs.items()}, outputs.gas))

