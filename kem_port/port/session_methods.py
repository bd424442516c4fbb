"""The session and chain methods: checked on the reader thread, run on the
GPU thread (as a control action of the GPU loop, so they never overlap a
batch), answered from there.

A chain step's failure is answered as ``{error, {Reason, #{step => N,
detail => Text}}}``, N counting from 1 as Erlang's ``lists:nth`` does;
every other failure as ``{error, {Reason, Detail}}`` (docs/sessions.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor as Threads
from typing import Any, Protocol

from kem_port.wire import session_protocol as sp
from kem_port.wire import terms
from kem_port.admission.guard import CompileGuard
from kem_port.errors import KemError, bad_args
from kem_port.gpu.session.chain_plan import Chain, Step, StepError
from kem_port.config import Config
from kem_port.wire.framing import FrameWriter
from kem_port.gpu.executor import Executor
from kem_port.gpu.session.session_service import SessionService
from kem_port.gpu.wgsl.wgsl_calls import may_loop
from kem_port.port.gpu_loop import SMALL_CALL, GpuLoop, QueueFull
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.wire.protocol import RequestError
from kem_port.stats import Stats

log = logging.getLogger("kem_port.session_methods")
INLINE_STEPS = 16
OK = terms.atom("ok")
Work = Callable[[], Any]


class Replies(Protocol):
    """What the router offers: its settings, counters, frame writer and replies."""

    config: Config
    stats: Stats
    writer: FrameWriter
    input_waiting: Callable[[], bool]

    def reply_ok(self, req_id: Any, result: Any) -> None: ...

    def reply_error(self, req_id: Any, error: KemError) -> None: ...


class SessionMethods:
    def __init__(self, loop: GpuLoop, executor: Executor, resolver: KernelResolver, fetchers: Threads, router: Replies,
                 guard: CompileGuard | None = None) -> None:
        self.guard = guard  # session and chain kernels are admitted as calls' kernels are (docs/security.md)
        self.loop = loop
        self.resolver = resolver
        self.fetchers = fetchers
        self.router = router
        self.config = router.config
        self.service = SessionService(executor, router.config, router.stats)
        self._queued = 0  # session work handed to the GPU thread, not yet done
        self._queued_lock = threading.Lock()

    def describe(self) -> dict[str, int]:
        return self.service.describe()

    def handle(self, req_id: int, method: str, args: tuple) -> bool:
        """Answer a session or chain method; False if `method` is none of them."""
        if method not in sp.SESSION_METHODS:
            return False
        try:
            if method in ("session_call", "chain"):
                self._kernel_method(req_id, method, args)
            else:
                work = self._buffer_work(method, args)
                self._submit(req_id, work, small=_small_buffer_op(method, args))
        except StepError as exc:
            self._reply_step_error(req_id, exc)
        return True

    # -- buffers and sessions ----------------------------------------------

    def _buffer_work(self, method: str, args: tuple) -> Work:
        store = self.service.sessions
        if method == "session_open":
            quota = sp.open_quota(args)
            return lambda: (store.incarnation, store.open(quota))
        if not args:
            raise bad_args(f"{method} takes {{Session, ...}}")
        ref = sp.session_ref(args[0])
        if method == "session_close":
            sp.arity(args, 1, "{Session}")
            return lambda: (store.close(*ref), OK)[1]
        if method == "buffer_list":
            sp.arity(args, 1, "{Session}")
            return lambda: {n.encode(): b.size for n, b in store.get(*ref).buffers.items()}
        if method == "buffer_free":
            sp.arity(args, 2, "{Session, Name}")
            name = sp.name(args[1])
            return lambda: (store.free(store.get(*ref), name), OK)[1]
        if method == "buffer_create":
            sp.arity(args, 3, "{Session, Name, Size | Bytes}")
            name, (size, data) = sp.name(args[1]), self._contents(args[2])
            return lambda: (store.create(store.get(*ref), name, size, data), OK)[1]
        if method == "buffer_write":
            sp.arity(args, 4, "{Session, Name, Offset, Bytes}")
            name, offset = sp.name(args[1]), sp.size(args[2], "offset", self.config)
            data = sp.binary(args[3], "Bytes", self.config)
            return lambda: (store.write(store.get(*ref), name, offset, data), OK)[1]
        sp.arity(args, 4, "{Session, Name, Offset, Length | undefined}")
        name, offset = sp.name(args[1]), sp.size(args[2], "offset", self.config)
        length = None if terms.atom_name(args[3]) == "undefined" else sp.size(args[3], "length", self.config)
        return lambda: store.read(store.get(*ref), name, offset, length)

    def _contents(self, value: Any) -> tuple[int, bytes | None]:
        if type(value) is int:
            return sp.size(value, "buffer size", self.config, minimum=4), None
        data = sp.binary(value, "buffer contents", self.config)
        return len(data), data

    # -- kernels in a session, chains --------------------------------------

    def _kernel_method(self, req_id: int, method: str, args: tuple) -> None:
        if method == "session_call":
            sp.arity(args, 4, "{Session, KernelId, Input, Opts}")
            ref: tuple[int, int] | None = sp.session_ref(args[0])
            data = sp.binary(args[2], "Input", self.config)
            steps, returns = [sp.call_step(args[1], data, args[3], self.config)], None
        else:
            sp.arity(args, 3, "{Session | undefined, Steps, Opts}")
            ref = None if terms.atom_name(args[0]) == "undefined" else sp.session_ref(args[0])
            steps = sp.chain_steps(args[1], self.config)
            data, returns = sp.chain_opts(args[2], self.config)
        resolver = self.resolver
        remote = [s.kernel_id for s in steps if resolver.resolve_local(s.kernel_id) is None]
        for index, step in enumerate(steps):
            if step.kernel_id in remote and not resolver.needs_fetch(step.kernel_id):
                raise StepError(index, KemError("kernel_not_found", f"no kernel {step.kernel_id!r}"))
        # A fetch or a first admission (a worker round trip) never runs on the reader.
        later = bool(remote) or not _all_admitted(self.guard, self.resolver, steps)

        def run() -> None:
            chain_steps = self._steps(steps)
            work = self._chain_work(method, ref, chain_steps, returns, data)
            self._submit(req_id, work, small=not later and self._small_chain(ref, steps, chain_steps, data))

        if later:
            self.fetchers.submit(self._answering(req_id, run))
        else:
            run()

    def _steps(self, steps: list[sp.StepArgs]) -> tuple[Step, ...]:  # kernels resolved and admitted
        return tuple(
            Step(self._source(i, s.kernel_id, s.entry_point), s.params, s.workgroups, s.entry_point, s.bind, s.input,
                 s.output, s.output_size)
            for i, s in enumerate(steps)
        )

    def _chain_work(self, method: str, ref, chain_steps: tuple[Step, ...], returns, data: bytes) -> Work:
        store, chains = self.service.sessions, self.service.chains

        def work() -> Any:
            session = store.get(*ref) if ref is not None else None
            try:
                result = chains.run(Chain(chain_steps, data, returns, session))
            except StepError as exc:
                if method == "session_call":  # one step: a plain error
                    raise KemError(exc.reason, exc.detail) from None
                raise
            # Buffer names go back as binaries (a str key would become an atom).
            return {n.encode(): v for n, v in result.items()} if isinstance(result, dict) else result

        return work

    def _small_chain(self, ref: tuple[int, int] | None, steps: list[sp.StepArgs], chain_steps: tuple[Step, ...], data: bytes) -> bool:
        """Short enough to run on the reader: little data, few steps, every kernel compiled
        (a compile takes tens of ms), none that may loop (inline_call.may_run_inline)."""
        outputs = [s.output_size if s.output_size is not None else len(data) for s in steps]
        held = self.service.sessions.bytes_of(ref[1]) if ref is not None else 0
        pipelines = self.service.chains.pipelines
        return (
            len(steps) <= INLINE_STEPS
            and len(data) + sum(outputs) + held <= SMALL_CALL
            and all(pipelines.has(self.resolver.resolve_local(s.kernel_id), s.entry_point, s.params) for s in steps)
            and not any(may_loop(s.source.text, s.source.sha256, s.entry_point) for s in chain_steps)
        )

    def _source(self, index: int, kernel_id: str, entry: str) -> KernelSource:
        resolver = self.resolver
        try:
            source = resolver.resolve_local(kernel_id) or resolver.fetch(kernel_id)
            return self.guard.admit_for_session(source, entry) if self.guard is not None else source
        except KemError as exc:
            raise StepError(index, exc) from None

    # -- running and answering ----------------------------------------------

    def _answering(self, req_id: int, run: Callable[[], None]) -> Callable[[], None]:
        """`run` on a fetch thread, its failure answered to the caller."""

        def guarded() -> None:
            try:
                run()
            except StepError as exc:
                self._reply_step_error(req_id, exc)
            except RequestError as exc:
                self.router.reply_error(exc.req_id, exc.error)
            except KemError as exc:
                self.router.reply_error(req_id, exc)
            except Exception as exc:
                log.exception("session fetch failed")
                self.router.reply_error(req_id, KemError("internal", f"{type(exc).__name__}: {exc}"))

        return guarded

    def _submit(self, req_id: int, work: Work, small: bool = False) -> None:
        """Run `work` on the GPU thread, or on this one when it is small and
        nothing else waits (as gpu_loop.run_inline does for small calls:
        waking the GPU thread cost ~0.4 ms of a ~0.9 ms call on lavapipe)."""

        @_tagged(req_id)
        def control(_executor: object) -> None:
            self._answering(req_id, lambda: self.router.reply_ok(req_id, self.service.run(work)))()

        # Session work keeps its order: none runs inline while earlier work is still
        # queued (the GPU thread takes an item a moment before the executor lock).
        if small and not self._queued and not self.router.input_waiting() and self.loop.run_control_inline(control):
            self.router.stats.inc("inline_session_calls")
            return

        @_tagged(req_id)
        def queued(executor: object) -> None:
            try:
                control(executor)
            finally:
                with self._queued_lock:
                    self._queued -= 1

        with self._queued_lock:
            self._queued += 1
        try:
            self.loop.put(queued)
        except QueueFull:
            with self._queued_lock:
                self._queued -= 1
            raise RequestError(req_id, KemError("overloaded", "the GPU queue is full")) from None

    def _reply_step_error(self, req_id: int, exc: StepError) -> None:
        self.router.stats.error(exc.reason)
        self.router.writer.write([_step_error_frame(req_id, exc)])


def _step_error_frame(req_id: int, exc: StepError) -> bytes:
    """{reply, ReqId, {error, {Reason, #{step, detail}}}}: which step failed."""
    detail = {terms.atom("step"): exc.step + 1, terms.atom("detail"): terms.Binary(exc.detail.encode("utf-8", "replace"))}
    return terms.encode((terms.atom("reply"), req_id, (terms.atom("error"), (terms.atom(exc.reason), detail))))


def _tagged(req_id: int) -> Callable[[Callable], Callable]:
    """Tag a control action with its ReqId, as a Job is: call_state then
    says queued or running for session work and chains too, so the node
    blames (and kills for) only work the GPU was inside (kem_timeout.erl)."""

    def tag(action: Callable) -> Callable:
        action.tag = req_id  # type: ignore[attr-defined]
        return action

    return tag


def _small_buffer_op(method: str, args: tuple) -> bool:
    """Buffer work of at most SMALL_CALL bytes (args already checked)."""
    if method in ("session_open", "session_close", "buffer_list", "buffer_free"):
        return True
    if method == "buffer_create":
        return (args[2] if type(args[2]) is int else len(terms.binary_bytes(args[2]) or b"")) <= SMALL_CALL
    if method == "buffer_write":
        return len(terms.binary_bytes(args[3]) or b"") <= SMALL_CALL
    return type(args[3]) is int and args[3] <= SMALL_CALL  # buffer_read with a length


def _all_admitted(guard: CompileGuard | None, resolver: KernelResolver, steps: list[sp.StepArgs]) -> bool:
    """Whether every step's kernel is local and already admitted for sessions."""
    if guard is None:
        return True
    sources = [(resolver.resolve_local(s.kernel_id), s.entry_point) for s in steps]
    return all(src is not None and guard.is_admitted_for_session(src, entry) for src, entry in sources)
