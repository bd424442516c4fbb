"""Every request's road through the port, in one place.

A frame is decoded and its envelope checked; quick methods (ping, hello,
stats, config, adapter_info) are answered on the reader thread. Kernel calls
are checked, their source resolved (local directories and the verified
cache inline, a gateway fetch on a worker thread) and queued for the GPU
thread, which runs them in batches. The queue is bounded: when it is full
the caller hears ``overloaded`` at once instead of waiting on a growing
backlog.

One exception to the hand-off: a small call to a compiled kernel that
arrives while the GPU is idle, nothing is queued and no other frame is
waiting in the pipe runs on the reader thread itself. Waking the GPU
thread cost ~400 us of a ~900 us small call on lavapipe (docs/executor.md);
under load the pipe is never empty, so calls still queue and batch.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kem_port import terms
from kem_port.batching import BatchSizer
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.executor import Executor, Flight, Job
from kem_port.framing import FrameWriter, write_all
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.protocol import INLINE_METHODS, KERNEL_METHODS, KernelCall, RequestError, kernel_call, parse_call
from kem_port.stats import Stats

log = logging.getLogger("kem_port.router")

Control = Callable[[Executor], None]
BATCH_BYTES = 64 << 20  # of input or output, whichever is larger, per batch
SMALL_CALL = 64 << 10  # batches of calls this small teach the batch sizer


def _call_bytes(job: Job) -> int:
    """What a call puts in a batch's buffers: the larger of input and output."""
    return max(job.call.output_size, len(job.call.input))


class Router:
    def __init__(
        self,
        config: Config,
        stats: Stats,
        executor: Executor,
        resolver: KernelResolver,
        writer: FrameWriter,
        input_waiting: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self.stats = stats
        self.executor = executor
        self.resolver = resolver
        self.writer = writer
        self.input_waiting = input_waiting
        # Held by whichever thread runs the executor: the GPU thread for
        # batches, the reader for an inline call.
        self._executor_lock = threading.Lock()
        self.gpu_queue: queue.Queue[Job | Control] = queue.Queue(maxsize=config.queue_limit)
        self._fetchers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kem-fetch")
        self._gpu_thread = threading.Thread(target=self._gpu_loop, name="kem-gpu", daemon=True)
        self.sizer = BatchSizer(config.max_batch)

    def start(self) -> None:
        self._gpu_thread.start()

    # -- replies ----------------------------------------------------------

    def reply_ok(self, req_id: Any, result: Any) -> None:
        self.writer.write([terms.ok_reply(req_id, result)])

    def reply_error(self, req_id: Any, error: KemError) -> None:
        self.stats.error(error.reason)
        self.writer.write([terms.error_reply(req_id, error.reason, error.detail)])

    # -- reader thread ----------------------------------------------------

    def handle_frame(self, frame: bytes) -> None:
        req_id: Any = None
        try:
            call = parse_call(terms.decode(frame))
            req_id = call.req_id
            self.stats.inc("calls")
            self._route(call.req_id, call.method, call.args)
        except RequestError as exc:
            self.reply_error(exc.req_id, exc.error)
        except KemError as exc:
            self.reply_error(req_id, exc)
        except Exception as exc:  # never let one request take the port down
            log.exception("internal error")
            self.reply_error(req_id, KemError("internal", f"{type(exc).__name__}: {exc}"))

    def _route(self, req_id: int, method: str, args: tuple) -> None:
        if method in KERNEL_METHODS:
            self._kernel(req_id, kernel_call(method, args, self.config))
        elif method in INLINE_METHODS:
            self._inline(req_id, method, args)
        else:
            raise RequestError(req_id, KemError("unknown_method", f"no method {method!r}"))

    def _inline(self, req_id: int, method: str, args: tuple) -> None:
        if method == "test_hook":
            self._test_hook(req_id, args)
            return
        if args != ():
            raise RequestError(req_id, KemError("bad_args", f"{method} takes {{}}"))
        if method == "ping":
            self.reply_ok(req_id, terms.atom("pong"))
        elif method == "hello":
            self.reply_ok(req_id, b"Hello world!")
        elif method == "adapter_info":
            if not self.executor.info:
                raise RequestError(req_id, KemError("no_adapter", "no GPU adapter is open"))
            self.reply_ok(req_id, self.executor.adapter_info_json({"kem": self.describe_config()}))
        elif method == "stats":
            self.reply_ok(req_id, self.stats.snapshot(self._live_stats()))
        elif method == "config":
            self.reply_ok(req_id, self.describe_config())

    def describe_config(self) -> dict:
        remote = self.resolver.remote.describe() if self.resolver.remote else {}
        return {
            "kernel_dirs": self.resolver.describe_local(),
            "max_output_bytes": self.config.max_output_bytes,
            "max_input_bytes": self.config.max_input_bytes,
            "queue_limit": self.config.queue_limit,
            "max_batch": self.config.max_batch,
            **remote,
        }

    def _live_stats(self) -> dict:
        live: dict[str, Any] = {"queue_depth": self.gpu_queue.qsize(), "batch_cap": self.sizer.limit()}
        live.update(self.executor.describe())
        if self.resolver.remote is not None:
            live.update(self.resolver.remote.describe_stats())  # type: ignore[attr-defined]
        return live

    def _kernel(self, req_id: int, call: KernelCall) -> None:
        source = self.resolver.resolve_local(call.kernel_id)
        if source is not None:
            self._enqueue(req_id, call, source, may_inline=True)
            return
        if not self.resolver.needs_fetch(call.kernel_id):
            raise RequestError(req_id, KemError("kernel_not_found", f"no kernel {call.kernel_id!r} in {self.resolver.describe_local()}"))
        self._fetchers.submit(self._fetch_then_enqueue, req_id, call)

    def _fetch_then_enqueue(self, req_id: int, call: KernelCall) -> None:
        try:
            source = self.resolver.fetch(call.kernel_id)
        except KemError as exc:
            self.reply_error(req_id, exc)
            return
        except Exception as exc:
            log.exception("fetch of %s failed", call.kernel_id)
            self.reply_error(req_id, KemError("internal", f"fetch failed: {exc}"))
            return
        try:
            self._enqueue(req_id, call, source)
        except RequestError as exc:
            self.reply_error(exc.req_id, exc.error)

    def _enqueue(self, req_id: int, call: KernelCall, source: KernelSource, may_inline: bool = False) -> None:
        job = Job(
            call=call,
            source=source,
            reply=lambda view, r=req_id, c=call: self._reply_result(r, c, view),
            fail=lambda err, r=req_id: self.reply_error(r, err),
        )
        if may_inline and self._run_inline(job):
            return
        try:
            self.gpu_queue.put_nowait(job)
        except queue.Full:
            self.stats.inc("overloaded")
            raise RequestError(
                req_id, KemError("overloaded", f"{self.config.queue_limit} calls are already queued on this port")
            ) from None

    def _run_inline(self, job: Job) -> bool:
        """Run a lone small call on this (the reader) thread; False if it must queue.

        Only calls that cannot hold the reader long qualify: small, no
        explicit workgroup count, kernel already compiled. The lock and the
        empty queue keep batches and inline calls from overtaking each other.
        """
        call = job.call
        if (
            _call_bytes(job) > SMALL_CALL
            or call.workgroups is not None
            or call.output_path is not None
            or not self.executor.is_warm(job.source, call)
            or self.input_waiting()
        ):
            return False
        if not self._executor_lock.acquire(blocking=False):
            return False
        try:
            if not self.gpu_queue.empty():
                return False
            self.stats.inc("inline_calls")
            self._land(self._step(None, [job]))
            return True
        finally:
            self._executor_lock.release()

    def _reply_result(self, req_id: int, call: KernelCall, view: memoryview) -> None:
        if call.output_path is None:
            self.writer.write(terms.ok_binary_reply(req_id, view))
            return
        # The node named a file in its shared-memory directory: the result
        # goes there (one copy from the mapped staging buffer into tmpfs)
        # and the reply carries only its size. The node deletes the file.
        try:
            fd = os.open(call.output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                write_all(fd, [view])
            finally:
                os.close(fd)
        except OSError as exc:
            self.reply_error(req_id, KemError("shm_error", f"cannot write the result: {exc.strerror}"))
            return
        self.writer.write([terms.ok_reply(req_id, (terms.atom("shm"), call.output_path, len(view)))])

    def _test_hook(self, req_id: int, args: tuple) -> None:
        if not self.config.test_hooks:
            raise RequestError(req_id, KemError("unknown_method", "test_hook is off (KEM_TEST_HOOKS=1)"))
        what = terms.atom_name(args[0]) if args else None
        if what == "stdout_noise":
            # What a misbehaving native library might do.
            print("noise from print()")
            os.write(1, b"noise written to fd 1\n")
            self.reply_ok(req_id, terms.atom("ok"))
        elif what == "destroy_device":
            self._control(req_id, lambda ex: ex.destroy_device_for_test())
        elif what == "sleep_gpu" and len(args) == 2 and type(args[1]) is int:
            self._control(req_id, lambda ex, ms=args[1]: time.sleep(ms / 1000))
        elif what == "sleep_reader" and len(args) == 2 and type(args[1]) is int:
            time.sleep(args[1] / 1000)  # a reader stuck in an inline call
            self.reply_ok(req_id, terms.atom("ok"))
        else:
            raise RequestError(
                req_id, KemError("bad_args", "test_hook {stdout_noise | destroy_device | sleep_gpu, Ms | sleep_reader, Ms}")
            )

    def _control(self, req_id: int, action: Control) -> None:
        def run(executor: Executor) -> None:
            action(executor)
            self.reply_ok(req_id, terms.atom("ok"))

        try:
            self.gpu_queue.put_nowait(run)
        except queue.Full:
            raise RequestError(req_id, KemError("overloaded", "the GPU queue is full")) from None

    # -- GPU thread -------------------------------------------------------

    def _gpu_loop(self) -> None:
        while True:
            first = self.gpu_queue.get()
            with self._executor_lock:
                self._serve(first)

    def _serve(self, item: Job | Control | None) -> None:
        """Run batches back to back while calls keep coming, each encoded
        while the one before it is on the GPU (Executor.step); return when
        the queue is empty and nothing is in flight."""
        flight: Flight | None = None
        while item is not None or flight is not None:
            batch, control = self._batch_from(item)
            landing = flight
            flight = self._step(flight, batch)
            if landing is not None:
                self._learn(landing)
            if control is not None:
                # A control action (test hooks) runs with nothing in flight.
                self._land(flight)
                flight = None
                self._run_control(control)
            item = self._next_nowait()

    def _batch_from(self, item: Job | Control | None) -> tuple[list[Job], Control | None]:
        if item is None:
            return [], None
        if not isinstance(item, Job):
            return [], item
        return self._drain(item)

    def _next_nowait(self) -> Job | Control | None:
        try:
            return self.gpu_queue.get_nowait()
        except queue.Empty:
            return None

    def _step(self, flight: Flight | None, batch: list[Job]) -> Flight | None:
        try:
            with self.writer.gathered():
                return self.executor.step(flight, batch)
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
        small = all(_call_bytes(job) <= SMALL_CALL for job in landed.jobs)
        self.sizer.record(len(landed.items), landed.spent, small)

    def _drain(self, first: Job) -> tuple[list[Job], Control | None]:
        """Take what is already queued, up to the sizer's cap and BATCH_BYTES."""
        batch = [first]
        total = _call_bytes(first)
        cap = self.sizer.limit()
        while len(batch) < cap and total < BATCH_BYTES:
            item = self._next_nowait()
            if item is None:
                break
            if not isinstance(item, Job):
                return batch, item
            batch.append(item)
            total += _call_bytes(item)
        return batch, None

    def _run_control(self, control: Control) -> None:
        try:
            control(self.executor)
        except Exception:
            log.exception("control action failed")
