"""A kernel call's road from a checked request to the GPU loop.

1. **Budget** (budget.py): the call takes its share of the port's calls and
   bytes, and holds it until it is answered, whichever wait it is in.
2. **Source**: local directories and the verified cache on the reader; a
   gateway fetch on a fetch thread (more threads than one gateway's
   ``KEM_GATEWAY_CONCURRENCY``, so a slow gateway cannot hold them all).
3. **Admission** (admission/guard.py): a known pipeline costs one dict
   lookup; a new one waits for the sacrificial compile on an admission
   thread, never on the reader or the GPU thread.
4. **Enqueue** on the GPU loop; a full queue is ``overloaded`` at once.
   (A lone small call the reader may run itself never gets here:
   lone_call.py runs it before the router hands a call to intake.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple

from kem_port.port import debug_calls
from kem_port.wire import log_frames
from kem_port.admission.guard import CompileGuard
from kem_port.arweave.budget import fetch_deadline
from kem_port.port.budget import WorkBudget
from kem_port.port.call_state import CallStates
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.port.group_calls import group_job
from kem_port.wire.group_frames import Group
from kem_port.port.gpu_loop import BATCH_BYTES, GpuLoop, QueueFull
from kem_port.port.replies import Replies
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.stats import Stats

log = logging.getLogger("kem_port.intake")

FETCH_THREADS = 16


class Deadline(NamedTuple):
    """The node's deadline for a call (``time.monotonic()``) and its timeout.
    A named tuple: made once per call, 0.22 us against a frozen
    dataclass's 0.39 us (timeit on the dev machine)."""

    at: float | None = None
    timeout_s: float | None = None


class Once:
    """A callable that runs its function the first time only, from any
    thread: ``list.pop`` is one atomic step, so no lock is made per call
    (made and run: 0.29 us, against 0.73 us with a Lock; timeit)."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = [fn]

    def __call__(self) -> None:
        try:
            fn = self._fn.pop()
        except IndexError:  # already run
            return
        fn()


class Intake:
    def __init__(self, config: Config, stats: Stats, executor: Executor, resolver: KernelResolver, loop: GpuLoop,
                 guard: CompileGuard | None, replies: Replies, input_waiting: Callable[[], bool]) -> None:
        self.config, self.stats, self.executor, self.resolver, self.loop = config, stats, executor, resolver, loop
        self.guard, self.replies, self.input_waiting = guard, replies, input_waiting
        self.reply, self.fail = replies.result, replies.error  # bound once: every call's answer
        self.budget = WorkBudget(config.queue_limit, config.queue_bytes)
        self._fetchers = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="kem-fetch")
        self._admitters = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kem-admit")
        self.states = CallStates(loop)  # where a call is, for call_state
        # Inside together() (the reader, one calls frame): kernel sources
        # found so far, and the jobs that go to the GPU queue at its end.
        self._sources: dict[str, KernelSource] | None = None
        self._held: list[Job] | None = None

    @contextmanager
    def together(self) -> Iterator[None]:
        """The calls of one calls frame (batch_frames.py), on the reader:
        each kernel's source is looked up once (a stat per call cost ~10%
        of the reader's time at 64 callers), none runs inline, and their
        jobs reach the GPU queue in one hand-off, so the GPU thread wakes
        once and takes them as one batch."""
        if self._held is not None:  # re-entered (a group inside a calls frame): the outer one's jobs stay
            yield
            return
        self._sources, self._held = {}, []
        try:
            yield
        finally:
            held, self._sources, self._held = self._held, None, None
            for job in self.loop.put_many(held):
                self.stats.inc("overloaded")
                job.refuse(KemError("overloaded", f"{self.config.queue_limit} calls are already queued on this port"))

    @property
    def fetch_pool(self) -> ThreadPoolExecutor:
        """Where fetches run; session methods fetch their kernels there too."""
        return self._fetchers

    def submit(self, req_id: int, call: KernelCall, deadline: float | None = None, timeout_s: float | None = None) -> None:
        """Take the call in, or raise KemError (answered by the router).
        With the node's deadline the call is answered ``timeout`` when it
        passes while the call waits for its fetch or in the queue."""
        size = call.batch_bytes
        try:
            self.budget.take(size)
        except KemError:
            self.stats.inc("overloaded")
            raise
        release = Once(partial(self.budget.give, size))  # no lambda: one cold frame fewer (docs/benchmarks.md)
        try:
            self._route(req_id, call, release, Deadline(deadline, timeout_s))
        except BaseException:
            release()
            raise

    def submit_group(self, group: Group) -> None:
        """A group frame's N calls (group_frames.py): budget taken at once (else overloaded, raised), the kernel
        resolved and admitted once, ONE job queued (gpu/group_job.py); a kernel to fetch or admit: _expand."""
        share = max(group.size, group.output_size)
        # More than the port may hold at once, idle or not, or more than one
        # batch carries (a group is never split; BATCH_BYTES): its single calls.
        if group.n * share > min(self.budget.max_bytes, BATCH_BYTES):
            return submit_singly(self, group)
        try:
            self.budget.take_many(group.n, group.n * share)
        except KemError:
            self.stats.inc("overloaded")
            raise
        try:
            call = KernelCall(group.kernel_id, group.inputs[: group.size], group.output_size)
            source = self._resolve_local(group.kernel_id)
            admitted = source if source is None or self.guard is None else self.guard.is_admitted(source, call)
            if admitted is not None:
                self.loop.put(group_job(group, call, admitted, share, self.budget, self.replies))
                self.stats.inc("group_jobs")
                return
        except QueueFull:
            self.budget.give_many(group.n, group.n * share)
            self.stats.inc("overloaded")
            raise KemError("overloaded", f"{self.config.queue_limit} calls are already queued on this port") from None
        except BaseException:  # nothing queued: the group's budget goes back before its callers hear why
            self.budget.give_many(group.n, group.n * share)
            raise
        self._expand(group, share)  # each call releases its own share from here

    def _expand(self, group: Group, share: int) -> None:
        """Each call of a group on its own road (fetch, admission), its budget held."""
        for req_id, call, deadline, timeout_s in single_calls(group):
            release = Once(lambda: self.budget.give(share))
            try:
                self._route(req_id, call, release, Deadline(deadline, timeout_s))
            except KemError as exc:
                release()
                self.fail(req_id, exc)

    def _route(self, req_id: int, call: KernelCall, release: Callable[[], None], deadline: Deadline) -> None:
        source = self._resolve_local(call.kernel_id)
        if source is None:
            if not self.resolver.needs_fetch(call.kernel_id):
                raise KemError("kernel_not_found", f"no kernel {call.kernel_id!r} on this node")
            find = lambda: self._fetch(req_id, call, deadline)  # noqa: E731
            self._fetchers.submit(self._later, req_id, call, release, find, deadline)
            return
        admitted = self.guard.is_admitted(source, call) if self.guard is not None else source
        if admitted is not None:
            self._enqueue(req_id, call, admitted, release, deadline, on_reader=True)
        else:
            self._admitters.submit(self._later, req_id, call, release, lambda: source, deadline)

    def _resolve_local(self, kernel_id: str) -> KernelSource | None:
        sources = self._sources
        if sources is None:
            return self.resolver.resolve_local(kernel_id)
        source = sources.get(kernel_id)
        if source is None:
            source = self.resolver.resolve_local(kernel_id)
            if source is not None:
                sources[kernel_id] = source
        return source

    def _fetch(self, req_id: int, call: KernelCall, deadline: Deadline) -> KernelSource:
        """The kernel from the gateways, within the call's time (arweave/budget.py)."""
        try:
            with self.states.waiting(req_id, "fetching", f"the gateways to deliver kernel {call.kernel_id}"):
                return self.resolver.fetch(call.kernel_id, fetch_deadline(deadline.at, deadline.timeout_s))
        except KemError as exc:
            if exc.reason == "timeout":  # say what the call waited for
                raise KemError("timeout", f"waiting for the kernel fetch: {exc.detail}") from None
            raise

    def _later(self, req_id: int, call: KernelCall, release: Callable[[], None], find: Callable[[], KernelSource],
               deadline: Deadline) -> None:
        """On a fetch or admission thread: find the source, admit it, enqueue."""
        try:
            source = find()
            if self.guard is not None:
                with self.states.waiting(req_id, "admitting", f"kernel {call.kernel_id} to compile in the guard"):
                    source = self.guard.admit(source, call)
            self._enqueue(req_id, call, source, release, deadline)
            return
        except KemError as exc:
            error = exc
        except Exception:
            log.exception("kernel %s could not be prepared", call.kernel_id)
            error = KemError("internal", "the kernel could not be prepared (details in the node's log)")
        release()
        log_frames.kernel_failed(call.kernel_id, error)
        self.fail(req_id, error)

    def _enqueue(self, req_id: int, call: KernelCall, source: KernelSource, release: Callable[[], None],
                 deadline: Deadline, on_reader: bool = False) -> None:

        def answer(view: memoryview) -> None:
            release()
            self.reply(req_id, call, view, job.gas)  # gas: a usage call's, set by its road

        def refuse(error: KemError) -> None:
            release()
            log_frames.kernel_failed(call.kernel_id, error)
            self.fail(req_id, error)

        job = Job(call=call, source=source, reply=answer, fail=refuse, tag=req_id, deadline=deadline.at)
        if call.debug:
            ok = self.replies.ok

            def answer_debug(value: tuple[bytes, dict]) -> None:
                release()
                ok(req_id, value)

            debug_calls.enqueue(self.loop, req_id, job, answer_debug)
            return
        if on_reader and self._held is not None:
            self._held.append(job)  # on the reader, in together(): queued at its end
            return
        try:
            self.loop.put(job)
        except QueueFull:
            self.stats.inc("overloaded")
            raise KemError("overloaded", f"{self.config.queue_limit} calls are already queued on this port") from None

    def describe(self) -> dict:
        return self.budget.describe() | (self.guard.describe() if self.guard is not None else {})


def single_calls(group: Group) -> Iterator[tuple[int, KernelCall, float | None, float | None]]:
    """The N calls a group means: ReqId, call, deadline and timeout (None: none)."""
    now = time.monotonic()
    size = group.size
    for i, (req_id, timeout_ms) in enumerate(zip(group.req_ids, group.entries["timeout_ms"].tolist())):
        timeout_s = timeout_ms / 1000.0 if timeout_ms else None
        call = KernelCall(group.kernel_id, group.inputs[i * size : (i + 1) * size], group.output_size)
        yield req_id, call, (now + timeout_s if timeout_s else None), timeout_s


def submit_singly(intake: Intake, group: Group) -> None:
    """A group larger than the byte budget, taken as the N single calls it
    means: each takes its own share (those past the budget hear overloaded,
    as they would alone; a lone call over it is still let in, budget.py)."""
    for req_id, call, deadline, timeout_s in single_calls(group):
        try:
            intake.submit(req_id, call, deadline, timeout_s)
        except KemError as exc:
            intake.fail(req_id, exc)
