"""Every request's road through the port: decode, check, route, reply.

A frame is decoded and its envelope checked; quick methods (ping, hello,
version, stats, config, adapter_info) are answered on the reader thread.
Frames are bounded before they are decoded (etf_guard.py). Kernel calls
are checked (protocol.py) and handed to intake.py: the port's work budget,
the kernel's source (a gateway fetch on a worker thread), its admission
(admission/guard.py) and the GPU loop (gpu_loop.py), which runs them in
batches. Whatever is full answers ``overloaded`` at once instead of letting
a backlog grow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kem_port.transfer import shm
from kem_port.wire import terms
from kem_port.port import test_hooks, warm
from kem_port.wire import group_frames
from kem_port.wire.batch_frames import is_calls_frame, split_calls
from kem_port.admission.guard import CompileGuard
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.wire.framing import FrameWriter
from kem_port.port.health import Health
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.executor import Executor
from kem_port.port.gpu_loop import GpuLoop
from kem_port.port.intake import Intake
from kem_port.kernel_store import KernelResolver
from kem_port.port.lone_fold import LoneFold
from kem_port.port.session_methods import SessionMethods
from kem_port.wire.protocol import (
    INLINE_METHODS,
    KERNEL_METHODS,
    version_info,
    Call,
    RequestError,
    Shm,
    hot_execute_kernel,
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
        guard: CompileGuard | None = None,
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
        self.intake = Intake(config, stats, executor, resolver, self.loop, guard, self._reply_result, self.reply_error, input_waiting, writer)
        self.session_methods = SessionMethods(self.loop, executor, resolver, self.intake.fetch_pool, self, guard)  # docs/sessions.md
        self.health = Health(executor, config)
        self.intake.reply_value = self.reply_ok  # debug calls answer a term (debug_calls.py)
        self.fold = LoneFold(self, input_waiting)  # the hot lone call's road, folded (lone_fold.py)

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
            self.writer.write_result(req_id, view)
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
        """One frame off the pipe: a request, or a calls frame of many
        (batch_frames.py), each of whose requests is read as a frame of its
        own; their kernel calls reach the GPU queue together."""
        if self.fold(frame):
            return
        calls = split_calls(frame) if is_calls_frame(frame) else None
        if calls is None:
            if self._handle_request(frame):
                self.stats.count_on_reader("calls")
            return
        self.writer.replies_frames = True
        self.stats.inc("calls_frames")
        hot = 0
        with self.intake.together():
            for request in calls:
                hot += self._handle_request(request)
        self.stats.inc("calls", hot)  # one lock for the frame's hot calls, not one each

    def _handle_request(self, frame: bytes) -> bool:
        """Answer or queue one request; True for a hot execute_kernel call the caller counts in ``calls``."""
        if group_frames.is_group_frame(frame):  # an item of a calls frame: read as at the top
            self._handle_group(frame)
            return False
        req_id: Any = None
        hot_call = False
        try:
            hot = hot_execute_kernel(frame, self.config)
            if hot is not None:
                req_id, hot_call = hot[0], True
                self.intake.submit(*hot)
                return True
            term = terms.decode_request(frame)
            group = group_frames.fields_of_term(term)  # a group frame in another spelling
            if group is not None:
                self._submit_group(group)
                return False
            call = parse_call(term)
            req_id = call.req_id
            self.stats.inc("calls")
            self._route(call)
        except RequestError as exc:
            self.reply_error(exc.req_id, exc.error)
        except KemError as exc:  # a refused frame may name its ReqId (etf_guard)
            self.reply_error(getattr(exc, "req_id", None) if req_id is None else req_id, exc)
        except Exception:  # never let one request take the port down
            log.exception("internal error")
            self.reply_error(req_id, KemError("internal", "internal error (details in the node's log)"))
        return hot_call

    def _handle_group(self, frame: bytes) -> None:
        """A group frame (group_frames.py): N calls checked once; a refusal holds for all N."""
        try:
            fields = group_frames.read_fields(frame)
            if fields is None:  # a spelling the narrow reader does not take
                fields = group_frames.fields_of_term(terms.decode_request(frame))
            if fields is None:
                raise KemError("bad_request", "expected {group, KernelId, Hint, Entries, Inputs}")
            self._submit_group(fields)
        except KemError as exc:  # the frame names no caller it can be sure of
            self.reply_error(getattr(exc, "req_id", None), exc)
        except Exception:
            log.exception("internal error")
            self.reply_error(None, KemError("internal", "internal error (details in the node's log)"))

    def _submit_group(self, fields: group_frames.GroupFields) -> None:
        self.writer.replies_frames = True
        self.stats.inc("group_frames")
        try:
            group = group_frames.check(fields, self.config)  # KemError: no caller named (to undefined)
        except group_frames.GroupRefused as exc:
            self.refuse_all(exc.req_ids, exc.error)
            return
        try:
            with self.intake.together():
                self.intake.submit_group(group)
        except KemError as exc:  # the budget refused the group as a whole
            self.refuse_all(group.req_ids, exc)
            return
        self.stats.inc("calls", group.n)

    def refuse_all(self, req_ids: list[int], error: KemError) -> None:
        with self.writer.gathered():  # one write for all N refusals
            for req_id in req_ids:
                self.reply_error(req_id, error)

    def _route(self, call: Call) -> None:
        req_id, method, args = call.req_id, call.method, call.args
        if method in KERNEL_METHODS:
            kcall = kernel_call(method, args, self.config, self.shm)
            try:
                self.intake.submit(req_id, kcall, call.deadline, call.timeout_s)
            except KemError as exc:
                raise RequestError(req_id, exc) from None
        elif method in INLINE_METHODS:
            self._inline(req_id, method, args)
        elif not self.session_methods.handle(req_id, method, args):
            raise RequestError(req_id, KemError("unknown_method", f"no method {method!r}"))

    def _inline(self, req_id: int, method: str, args: tuple) -> None:
        if method == "test_hook":
            test_hooks.handle(self, req_id, args)
            return
        if method == "warm":  # compile kernels before serving (warm.py)
            return warm.request(req_id, args, self.resolver, self.loop, self.intake.guard, self.reply_ok, self.reply_error)
        if method == "call_state":
            if len(args) != 1:
                raise RequestError(req_id, KemError("bad_args", "call_state takes {ReqId}"))
            self.reply_ok(req_id, self.intake.states.describe(args[0]))
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
        elif method == "health":
            self.reply_ok(req_id, self.health.describe())
        elif method == "stats":
            self.reply_ok(req_id, self.stats.snapshot(self._live_stats()))
        elif method == "config":
            self.reply_ok(req_id, self.describe_config())

    def describe_config(self) -> dict:
        return describe_config(self.config, self.resolver)

    def _live_stats(self) -> dict:
        live: dict[str, Any] = self.loop.describe() | self.intake.describe()
        live.update(self.executor.describe(), **self.session_methods.describe())
        if self.resolver.remote is not None:
            live.update(self.resolver.remote.describe_stats())  # type: ignore[attr-defined]
        return live



def describe_config(config: Config, resolver: KernelResolver) -> dict:
    """What the `config` method answers (and adapter_info under "kem")."""
    remote = resolver.remote.describe() if resolver.remote else {}
    return {
        "kernel_dirs": len(resolver.local),  # a count: paths stay in the log
        "max_output_bytes": config.max_output_bytes,
        "max_input_bytes": config.max_input_bytes,
        "queue_limit": config.queue_limit,
        "queue_bytes": config.queue_bytes,
        "max_batch": config.max_batch,
        **remote,
    }
