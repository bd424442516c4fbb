"""The GPU thread: a bounded queue of jobs, drained into batches that run
back to back, each encoded while the one before it is on the GPU.

The batch size is learned from what landed batches cost (batching.py,
from ``Flight.cost()``). A small call to a compiled kernel that arrives
while the GPU is idle, with nothing queued or waiting in the pipe, runs on
the reader thread itself (port/lone_call.py, :meth:`GpuLoop.run_held`):
waking the GPU thread cost ~400 us of a ~900 us small call on lavapipe
(docs/executor.md). Under load calls queue and batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from kem_port.port.batching import BatchSizer
from kem_port.errors import KemError
from kem_port.gpu.batch import Flight
from kem_port.gpu.blame import OnGpu, loop_key
from kem_port.gpu.calls import Job
from kem_port.gpu.executor import Executor

log = logging.getLogger("kem_port.gpu_loop")

Control = Callable[[Executor], None]
BATCH_BYTES = 64 << 20  # of input or output, whichever is larger, per batch
SMALL_CALL = 64 << 10  # batches of calls this small teach the batch sizer
GATHER = 64  # calls by named buffers of one kernel run in one submission (_gather)


class QueueFull(Exception):
    pass


class GpuLoop:
    def __init__(
        self,
        executor: Executor,
        queue_limit: int,
        max_batch: int,
        gathered: Callable[[], AbstractContextManager],
    ) -> None:
        self.executor = executor
        # Replies of one step go out together (FrameWriter.gathered: one writev).
        self._gathered = gathered
        # Held by whichever thread runs the executor: the GPU thread for
        # batches, the reader for an inline call.
        self._executor_lock = self.executor_lock = threading.Lock()  # public: the reader's lone road takes it (lone_call.py)
        self.queue: queue.Queue[Job | Control] = queue.Queue(maxsize=queue_limit)
        self.sizer = BatchSizer(max_batch)
        self._thread = threading.Thread(target=self._loop, name="kem-gpu", daemon=True)
        # What the GPU thread is inside now, for state_of (gpu/blame.py): replaced
        # whole, never changed in place, so the reader reads it without a lock.
        self._on_gpu = OnGpu()
        self._control_tag: object = None
        self._control_tags: frozenset = frozenset()  # a gathered action's calls (_gather)
        # The tag of the call the reader runs inline now (the reader's
        # lone road, lone_call.py), set without a lock: one store each way.
        self.inline_tag: object = None

    def start(self) -> None:
        self._thread.start()

    def put(self, item: Job | Control) -> None:
        """Queue a job or a control action; QueueFull when the queue is."""
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            raise QueueFull from None

    def put_many(self, jobs: list[Job]) -> list[Job]:
        """Queue jobs in one hand-off; return those the queue had no room for."""
        return _put_all(self.queue, jobs)

    def describe(self) -> dict:
        return {"queue_depth": self.queue.qsize(), "batch_cap": self.sizer.limit()}

    def state_of(self, tag: object) -> tuple[str, int] | None:
        """("running", 0) when the GPU thread is inside the call tagged tag,
        ("queued", calls ahead of it), or None when it is in neither."""
        if tag is None:
            return None
        if tag == self.inline_tag or tag == self._control_tag or tag in self._control_tags:
            return "running", 0
        if (where := self._on_gpu.where(tag)) is not None:
            return where
        with self.queue.mutex:
            waiting = list(self.queue.queue)
        ahead = 0
        for item in waiting:
            if item.has_tag(tag) if isinstance(item, Job) else getattr(item, "tag", None) == tag:
                return "queued", ahead
            ahead += item.calls if isinstance(item, Job) else 1
        return None

    def run_held(self, job: Job) -> None:
        """A lone call on the executor's lone road (its shape's kit,
        gpu/lone_road.py, else a batch of one), by a caller on the reader
        that holds the executor lock and saw the queue empty
        (port/lone_call.py): the lock and the empty queue keep batches and
        inline calls from overtaking each other."""
        if self.executor.run_lone(job):  # its kit: one reply, written at once
            return
        # One gathered write for both steps (a refusal in the first, the
        # answer in the landing): one context instead of two per call.
        with self._gathered():
            flight = self._step(None, [job], lone=True, gather=False)
            if flight is not None:
                self._step(flight, [], gather=False)
                self._learn(flight)

    def run_control_inline(self, control: Control) -> bool:
        """Run a short control action (session work, session_methods.py) on
        the calling thread when the GPU thread is idle; False if it must queue."""
        if not self._executor_lock.acquire(blocking=False):
            return False
        try:
            if not self.queue.empty():
                return False
            self._run_control(control)
            return True
        finally:
            self._executor_lock.release()

    def _loop(self) -> None:
        while True:
            first = self.queue.get()
            with self._executor_lock:
                self._serve(first)

    def _serve(self, item: Job | Control | None) -> None:
        """Run batches back to back while calls keep coming (Executor.step);
        return when the queue is empty and nothing is in flight."""
        flight: Flight | None = None
        while item is not None or flight is not None:
            batch, control = self._batch_from(item)
            batch = self._unexpired(batch)
            landing = flight
            self._on_gpu = OnGpu(flight.jobs if flight is not None else [], batch)
            flight = self._step(flight, batch)
            self._on_gpu = OnGpu(flight.jobs if flight is not None else [])
            if landing is not None:
                self._learn(landing)
            if control is not None:
                # A control action (test hooks) runs with nothing in flight.
                self._land(flight)
                flight = None
                self._on_gpu = OnGpu()
                self._run_control(_gather(self.queue, control))
            item = self._next_nowait()

    def _batch_from(self, item: Job | Control | None) -> tuple[list[Job], Control | None]:
        if item is None:
            return [], None
        if not isinstance(item, Job):
            return [], item
        return self._drain(item)

    def _unexpired(self, batch: list[Job]) -> list[Job]:
        """Answer the calls whose caller stopped waiting while they were
        queued (a GPU busy with other work is not theirs to die for)."""
        now = time.monotonic()
        # The earliest deadline decides whether any passed: one min() over
        # the batch instead of a method call per job.
        deadlines = [job.deadline for job in batch if job.deadline is not None]
        if not deadlines or min(deadlines) >= now:
            return batch
        for job in batch:
            if job.expired(now):
                waited = (time.perf_counter() - job.enqueued) * 1000
                error = KemError("timeout", f"waited {waited:.0f} ms in the port's queue; the call's deadline passed before the GPU started it")
                job.expire(now, error)  # a group: its slots past their deadline; the others run
        return [job for job in batch if not job.answered]

    def _next_nowait(self) -> Job | Control | None:
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            return None

    def _drain(self, first: Job) -> tuple[list[Job], Control | None]:
        """Take what is already queued, up to the sizer's cap and BATCH_BYTES."""
        return _take_batch(self.queue, first, self.sizer.limit(), BATCH_BYTES)

    def _step(self, flight: Flight | None, batch: list[Job], lone: bool = False, gather: bool = True) -> Flight | None:
        """One Executor.step; its replies go out in one write unless the
        caller gathers them itself (gather=False)."""
        try:
            if not gather:
                return self.executor.step(flight, batch, lone)
            with self._gathered():
                return self.executor.step(flight, batch, lone)
        except Exception as exc:  # a bug must not kill the GPU thread or leave a caller waiting
            log.exception("executor failed")
            error = KemError("internal", f"{type(exc).__name__}: {exc}")
            for job in batch + (flight.jobs if flight is not None else []):
                job.refuse(error)
            return None

    def _land(self, flight: Flight | None) -> None:
        """Finish a batch in flight, submitting nothing after it."""
        if flight is not None:
            self._step(flight, [])
            self._learn(flight)

    def _learn(self, landed: Flight) -> None:
        """Teach the batch sizer what a batch cost from encoding to delivery."""
        cost = landed.cost()
        self.sizer.record(cost.calls, cost.seconds, cost.largest_call_bytes <= SMALL_CALL)

    def _run_control(self, control: Control) -> None:
        self._control_tag = getattr(control, "tag", None)
        self._control_tags = getattr(control, "tags", frozenset())
        try:
            control(self.executor)
        except Exception:
            log.exception("control action failed")
        finally:
            self._control_tag = None
            self._control_tags = frozenset()


def _gather(q: queue.Queue, control: Control) -> Control:
    """The control action and those queued right behind it with its gather
    key (named calls of one kernel: port/run_methods.NamedRun), as one
    action (one submission); up to GATHER, under one lock as _take_batch."""
    key = getattr(control, "gather_key", None)
    if key is None:
        return control
    taken = [control]
    with q.mutex:
        while len(taken) < GATHER and q._qsize() and getattr(q.queue[0], "gather_key", None) == key:
            taken.append(q._get())
        if len(taken) > 1:
            q.not_full.notify(len(taken) - 1)
    if len(taken) == 1:
        return control

    def together(executor: Executor) -> None:
        control.gather(executor, taken)

    together.tags = frozenset(c.tag for c in taken)  # type: ignore[attr-defined]  # state_of: each is running
    return together


def _put_all(q: queue.Queue, jobs: list[Job]) -> list[Job]:
    """Put jobs under one lock with one wake-up of the GPU thread (a calls
    frame's jobs, intake.py); one put_nowait per job woke it up to once per
    job. queue.Queue has no batch put: its documented subclassing hooks
    (_put, _qsize) and conditions are used under its own mutex."""
    with q.not_full:
        room = len(jobs) if q.maxsize <= 0 else max(0, q.maxsize - q._qsize())
        for job in jobs[:room]:
            q._put(job)
        if room and jobs:
            q.unfinished_tasks += min(room, len(jobs))
            q.not_empty.notify()
    return jobs[room:]


def _take_batch(q: queue.Queue, first: Job, cap: int, byte_limit: int) -> tuple[list[Job], Control | None]:
    """`first` and the jobs queued behind it, taken under one lock: up to
    `cap` calls (a GroupJob counts its slots and is never split, so one
    may take a batch past `cap`) and until their batch_bytes reach
    `byte_limit`, stopping at a control action (returned, to run once the batch has landed). One
    get_nowait per job took the queue's mutex and notified not_full once per
    job: with _unexpired, 1.1-1.5 us a job against 0.4-0.7 for this at 64
    jobs (scripts/batch_curve.py --drain 64, runs alternating with the
    commit before). The hooks are queue.Queue's documented subclassing ones
    (_get, _qsize), as _put_all's."""
    batch = [first]
    total = first.batch_bytes
    calls = first.calls
    control: Control | None = None
    # A kernel that may loop shares a batch only with its own calls, so a
    # stuck batch names its kernel (gpu/blame.py); the rest waits for the
    # next batch. The first sight of a kernel parses it here (~1 ms for a
    # few-KB kernel), later ones are one dict lookup.
    sharing = loop_key(first)
    with q.mutex:
        while calls < cap and total < byte_limit and q._qsize():
            item = q.queue[0]
            if isinstance(item, Job) and loop_key(item) != sharing:
                break
            item = q._get()
            if not isinstance(item, Job):
                control = item
                break
            batch.append(item)
            total += item.batch_bytes
            calls += item.calls
        taken = len(batch) - 1 + (control is not None)
        if taken:
            q.not_full.notify(taken)
    return batch, control
