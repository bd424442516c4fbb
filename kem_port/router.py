"""Every request's road through the port: decode, check, route, reply.

A frame is decoded and its envelope checked; quick methods (ping, hello,
version, stats, config, adapter_info) are answered on the reader thread.
Kernel calls are checked, their source resolved (local directories and
the verified cache inline, a gateway fetch on a worker thread) and handed
to the GPU loop (gpu_loop.py), which runs them in batches. The queue is
bounded: when it is full the caller hears ``overloaded`` at once instead of
waiting on a growing backlog. A lone small call to a compiled kernel may
run inline on the reader (gpu_loop.py says why).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kem_port import shm, terms
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.framing import FrameWriter
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.gpu_loop import SMALL_CALL, Control, GpuLoop, QueueFull
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.session_methods import SessionMethods
from kem_port.protocol import (
    INLINE_METHODS,
    KERNEL_METHODS,
    version_info,
    RequestError,
    Shm,
    kernel_call,
    parse_call,
)
from kem_port.stats import Stats

log = logging.getLogger("kem_port.router")


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
        memory = shm.SharedMemory(config.shm_dir, config.max_input_bytes)
        self.shm = Shm(read_input=memory.read_input, output_path=memory.path)
        self.loop = GpuLoop(executor, config.queue_limit, config.max_batch, writer.gathered)
        self._fetchers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kem-fetch")
        self.session_methods = SessionMethods(self.loop, executor, resolver, self._fetchers, self)  # docs/sessions.md

    def start(self) -> None:
        self.loop.start()

    # -- replies ----------------------------------------------------------

    def reply_ok(self, req_id: Any, result: Any) -> None:
        self.writer.write([terms.ok_reply(req_id, result)])

    def reply_error(self, req_id: Any, error: KemError) -> None:
        self.stats.error(error.reason)
        self.writer.write([terms.error_reply(req_id, error.reason, error.detail)])

    def _reply_result(self, req_id: int, call: KernelCall, view: memoryview) -> None:
        if call.output_path is None:
            self.writer.write(terms.ok_binary_reply(req_id, view))
            return
        # The reply carries only the size of the file the result went to.
        try:
            shm.write_result(call.output_path, view)
        except KemError as exc:
            self.reply_error(req_id, exc)
            return
        self.writer.write([terms.ok_reply(req_id, (terms.atom("shm"), call.output_path, len(view)))])

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
            self._kernel(req_id, kernel_call(method, args, self.config, self.shm))
        elif method in INLINE_METHODS:
            self._inline(req_id, method, args)
        elif not self.session_methods.handle(req_id, method, args):
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
        elif method == "version":
            self.reply_ok(req_id, version_info())
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
        live: dict[str, Any] = self.loop.describe()
        live.update(self.executor.describe(), **self.session_methods.describe())
        if self.resolver.remote is not None:
            live.update(self.resolver.remote.describe_stats())  # type: ignore[attr-defined]
        return live

    # -- kernel calls -----------------------------------------------------

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
        if may_inline and self._may_run_inline(job) and self.loop.run_inline(job):
            self.stats.inc("inline_calls")
            return
        try:
            self.loop.put(job)
        except QueueFull:
            self.stats.inc("overloaded")
            raise RequestError(
                req_id, KemError("overloaded", f"{self.config.queue_limit} calls are already queued on this port")
            ) from None

    def _may_run_inline(self, job: Job) -> bool:
        """Only calls that cannot hold the reader long: small, no explicit
        workgroup count, no shared-memory result, kernel already compiled,
        and no other frame waiting in the pipe."""
        call = job.call
        return not (
            call.batch_bytes > SMALL_CALL
            or call.workgroups is not None
            or call.output_path is not None
            or not self.executor.is_warm(job.source, call)
            or self.input_waiting()
        )

    # -- test hooks (KEM_TEST_HOOKS=1) -----------------------------------

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
            self.loop.put(run)
        except QueueFull:
            raise RequestError(req_id, KemError("overloaded", "the GPU queue is full")) from None
