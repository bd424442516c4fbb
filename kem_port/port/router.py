"""Every request's road through the port: read once, routed, answered.

A frame is read once into a typed request (wire/requests.py); quick
methods (ping, hello, version, stats, config, adapter_info, health,
call_state) are answered on the reader thread; a lone small kernel call
may run inline on it (lone_call.py); other kernel calls go to intake.py
(the port's work budget, the kernel's source, its admission, the GPU
loop); sessions and chains to session_methods.py. Every answer goes down
through one Replies (replies.py). Whatever is full answers ``overloaded``
at once instead of letting a backlog grow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kem_port.admission.guard import CompileGuard
from kem_port.config import Config
from kem_port.errors import KemError, internal
from kem_port.gpu.executor import Executor
from kem_port.kernel_store import KernelResolver
from kem_port.port import test_hooks, warm
from kem_port.port.gpu_loop import GpuLoop
from kem_port.port.health import Health
from kem_port.port.intake import Intake
from kem_port.port.lone_call import LoneCall
from kem_port.port.replies import Replies
from kem_port.port.run_methods import RunMethods
from kem_port.port.session_methods import SessionMethods
from kem_port.stats import Stats
from kem_port.transfer import shm
from kem_port.wire import terms
from kem_port.wire.protocol import INLINE_METHODS, RequestError, Shm, version_info
from kem_port.wire.request_types import CallsRequest, GroupRequest, KernelRequest, MethodRequest
from kem_port.wire.requests import Request, RequestReader
from kem_port.wire.run_requests import RunRequest
from kem_port.wire.session_requests import BufferRequest, ChainRequest

log = logging.getLogger("kem_port.router")


class Router:
    def __init__(
        self,
        config: Config,
        stats: Stats,
        executor: Executor,
        resolver: KernelResolver,
        replies: Replies,
        input_waiting: Callable[[], bool] = lambda: True,
        guard: CompileGuard | None = None,
        open_error: BaseException | None = None,
    ) -> None:
        self.config, self.stats, self.executor, self.resolver, self.replies = config, stats, executor, resolver, replies
        self.input_waiting = input_waiting
        memory = shm.SharedMemory(config.shm_dir, config.max_input_bytes)
        self.reader = RequestReader(config, Shm(read_input=memory.read_input, output_path=memory.path))
        self.loop = GpuLoop(executor, config.queue_limit, config.max_batch, replies.gathered)
        self.intake = Intake(config, stats, executor, resolver, self.loop, guard, replies, input_waiting)
        self.session_methods = SessionMethods(config, stats, self.loop, executor, resolver, self.intake.fetch_pool,
                                              replies, input_waiting, guard)  # docs/sessions.md
        self.runs = RunMethods(self.loop, resolver, self.intake.fetch_pool, replies, self.intake.budget, guard,
                               self.intake.states, input_waiting)
        self.health = Health(executor, config, open_error)
        self.lone = LoneCall(stats, self.intake, self.loop, executor, resolver, replies, input_waiting)

    def start(self) -> None:
        self.loop.start()

    # -- reader thread ----------------------------------------------------

    def handle_frame(self, frame: bytes) -> None:
        """One frame off the pipe, read once (wire/requests.py) and routed:
        a calls frame's requests reach the GPU queue together."""
        request = self.reader.read(frame)
        if type(request) is KernelRequest:
            if not self.lone(request):  # run inline and counted there, else its road from intake on
                self._kernel(request)
                self.stats.count_on_reader("calls")
            return
        if type(request) is not CallsRequest:
            self._route(request)
            return
        self.replies.node_sends_batches()
        self.stats.inc("calls_frames")
        with self.intake.together():
            for item in request.requests:
                self._route(item)

    def _route(self, request: Request) -> None:
        """Answer or queue one request of any kind but a calls frame."""
        kind = type(request)
        if kind is KernelRequest:
            self._kernel(request)
            self.stats.inc("calls")
        elif kind is MethodRequest:
            self.stats.inc("calls")
            self._method(request)
        elif kind is BufferRequest or kind is ChainRequest:
            self.stats.inc("calls")
            self._session(request)
        elif kind is RunRequest:
            self.stats.inc("calls")
            self.replies.answering(request.req_id, lambda: self.runs.handle(request))  # run_methods.py
        elif kind is GroupRequest:
            self._group(request)
        else:
            if request.enveloped:
                self.stats.inc("calls")
            if request.group:  # as a group frame the checks took: the peer sends them, so reads replies frames
                self.replies.node_sends_batches()
                self.stats.inc("group_frames")
            self.refuse_all(request.req_ids, request.error)

    def _kernel(self, request: KernelRequest) -> None:
        try:
            self.intake.submit(request.req_id, request.call, request.deadline, request.timeout_s)
        except KemError as exc:
            self.replies.error(request.req_id, exc)
        except Exception:  # never let one request take the port down
            log.exception("internal error")
            self.replies.internal(request.req_id)

    def _group(self, request: GroupRequest) -> None:
        """A group frame (group_frames.py): N calls checked once; a refusal holds for all N."""
        group = request.group
        self.replies.node_sends_batches()
        self.stats.inc("group_frames")
        try:
            with self.intake.together():
                self.intake.submit_group(group)
        except KemError as exc:  # the budget refused the group as a whole
            self.refuse_all(group.req_ids, exc)
            return
        except Exception:
            log.exception("internal error")
            self.refuse_all(group.req_ids, internal())
            return
        self.stats.inc("calls", group.n)

    def refuse_all(self, req_ids: list, error: KemError) -> None:
        if len(req_ids) == 1:
            self.replies.error(req_ids[0], error)
        else:
            self.replies.refuse_all(req_ids, error)

    def _session(self, request: BufferRequest | ChainRequest) -> None:
        self.replies.answering(request.req_id, lambda: self.session_methods.handle(request))  # docs/sessions.md

    def _method(self, request: MethodRequest) -> None:
        req_id, method, args = request.req_id, request.method, request.args
        if method not in INLINE_METHODS:
            self.replies.error(req_id, KemError("unknown_method", f"no method {method!r}"))
            return
        self.replies.answering(req_id, lambda: self._inline(req_id, method, args))

    def _inline(self, req_id: int, method: str, args: tuple) -> None:
        if method == "test_hook":
            test_hooks.handle(self.config, self.loop, self.intake.guard, self.replies, req_id, args)
            return
        if method == "warm":  # compile kernels before serving (warm.py)
            return warm.request(req_id, args, self.resolver, self.loop, self.intake.guard, self.replies)
        if method == "call_state":
            if len(args) != 1:
                raise RequestError(req_id, KemError("bad_args", "call_state takes {ReqId}"))
            self.replies.ok(req_id, self.intake.states.describe(args[0]))
            return
        if args != ():
            raise RequestError(req_id, KemError("bad_args", f"{method} takes {{}}"))
        if method == "ping":
            self.replies.ok(req_id, terms.atom("pong"))
        elif method == "hello":
            self.replies.ok(req_id, b"Hello world!")
        elif method == "version":
            self.replies.ok(req_id, version_info())
        elif method == "adapter_info":
            if not self.executor.info:
                raise RequestError(req_id, KemError("no_adapter", "no GPU adapter is open"))
            self.replies.ok(req_id, self.executor.adapter_info_json({"kem": self.describe_config()}))
        elif method == "health":
            self.replies.ok(req_id, self.health.describe())
        elif method == "stats":
            self.replies.ok(req_id, self.stats.snapshot(self._live_stats()))
        elif method == "config":
            self.replies.ok(req_id, self.describe_config())

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
