"""The session and chain methods: checked on the reader thread, run on the
GPU thread (as a control action of the GPU loop, so they never overlap a
batch), answered from there.

A chain step's failure is answered as ``{error, {Reason, #{step => N,
detail => Text}}}``, N counting from 1 as Erlang's ``lists:nth`` does;
every other failure as ``{error, {Reason, Detail}}`` (docs/sessions.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor as Threads
from typing import Any

from kem_port.wire import session_protocol as sp
from kem_port.wire import terms
from kem_port.admission.guard import CompileGuard
from kem_port.errors import KemError
from kem_port.gpu.session.chain_steps import AnyStep, Chain, ClearStep, CopyStep, Step, StepError
from kem_port.config import Config
from kem_port.gpu.executor import Executor
from kem_port.gpu.pipelines import named_shader
from kem_port.gpu.session.chain import READER_INVOCATIONS, NotForReader
from kem_port.gpu.session.chain_kit import KIT_BYTES, ChainKit
from kem_port.gpu.session.session_service import SessionService
from kem_port.gpu.wgsl.wgsl_calls import may_loop
from kem_port.port.chain_gather import answer_value, gatherable
from kem_port.port.gpu_loop import SMALL_CALL, GpuLoop, QueueFull
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.wire.protocol import RequestError
from kem_port.wire.session_requests import BufferRequest, ChainRequest
from kem_port.port.replies import Replies
from kem_port.stats import Stats

INLINE_STEPS = 16
OK = terms.atom("ok")
Work = Callable[[bool], Any]  # its argument: whether the reader runs it (else the GPU thread)


class SessionMethods:
    def __init__(self, config: Config, stats: Stats, loop: GpuLoop, executor: Executor, resolver: KernelResolver,
                 fetchers: Threads, replies: Replies, input_waiting: Callable[[], bool],
                 guard: CompileGuard | None = None) -> None:
        self.guard = guard  # session and chain kernels are admitted as calls' kernels are (docs/security.md)
        self.loop, self.resolver, self.fetchers, self.config = loop, resolver, fetchers, config
        self.replies, self.stats, self.input_waiting = replies, stats, input_waiting
        self.service = SessionService(executor, config, stats)
        self._queued = 0  # session work handed to the GPU thread, not yet done
        self._queued_lock = threading.Lock()

    def describe(self) -> dict[str, int]:
        return self.service.describe()

    def handle(self, request: BufferRequest | ChainRequest) -> None:
        """Answer a session or chain method, read and checked (wire/session_requests.py)."""
        try:
            if type(request) is ChainRequest:
                self._kernel_method(request)
            else:
                moved = request.bytes_moved()
                self._submit(request.req_id, self._buffer_work(request), small=0 <= moved <= SMALL_CALL)
        except StepError as exc:
            self.replies.error(request.req_id, _shaped(request.method, exc))

    # -- buffers and sessions ----------------------------------------------

    def _buffer_work(self, request: BufferRequest) -> Work:
        run = self._buffer_action(request)
        return lambda _reader: run()

    def _buffer_action(self, request: BufferRequest) -> Callable[[], Any]:
        store, method, ref, name = self.service.sessions, request.method, request.ref, request.name
        if method == "session_open":
            return lambda: (store.incarnation, store.open(request.quota))
        if method == "session_close":
            return lambda: (self.service.chains.kits.forget(store.get(*ref)), store.close(*ref), OK)[2]
        if method == "buffer_list":
            return lambda: {n.encode(): b.size for n, b in store.get(*ref).buffers.items()}
        if method == "buffer_free":
            return lambda: (store.free(store.get(*ref), name), OK)[1]
        if method == "buffer_create":
            return lambda: (store.create(store.get(*ref), name, request.size, request.data), OK)[1]
        if method == "buffer_write":
            return lambda: (store.write(store.get(*ref), name, request.offset, request.data), OK)[1]
        return lambda: store.read(store.get(*ref), name, request.offset, request.length)

    # -- kernels in a session, chains --------------------------------------

    def _kernel_method(self, request: ChainRequest) -> None:
        req_id, steps = request.req_id, request.steps
        key = _kit_key(request)
        kit = self.service.chains.kits.get(key) if key is not None else None
        if kit is not None and self._fresh(kit):  # a repeat of a kept shape: no resolving, admitting or planning
            # Stateless repeats queued together share a submission (chain_gather.py).
            batch = (key, request) if request.ref is None else None
            self._submit(req_id, self._chain_work(request, None, key), small=_small_kit(kit), batch=batch)
            return
        resolver = self.resolver
        remote = [s.kernel_id for s in _kernels(steps) if resolver.resolve_local(s.kernel_id) is None]
        for index, step in enumerate(steps):
            if isinstance(step, sp.StepArgs) and step.kernel_id in remote and not resolver.needs_fetch(step.kernel_id):
                raise StepError(index, KemError("kernel_not_found", f"no kernel {step.kernel_id!r}"))
        # A fetch or a first admission (a worker round trip) never runs on the reader.
        later = bool(remote) or not _all_admitted(self.guard, self.resolver, steps)

        def run() -> None:
            try:
                chain_steps = self._steps(steps)
            except StepError as exc:
                raise _shaped(request.method, exc) from None
            small = not later and self._small_chain(request.ref, steps, chain_steps, request.data)
            self._submit(req_id, self._chain_work(request, chain_steps, key), small=small)

        if later:
            self.fetchers.submit(self._answering(req_id, run))
        else:
            run()

    def unqueue(self, count: int) -> None:  # session work that ran: later work may run inline again
        with self._queued_lock:
            self._queued -= count

    def _fresh(self, kit: ChainKit) -> bool:
        """Whether every kernel file of a kit still holds the text it was admitted with."""
        resolve = self.resolver.resolve_local
        return all((found := resolve(kernel_id)) is not None and found.sha256 == sha for kernel_id, sha in kit.sources.items())

    def _steps(self, steps: list) -> tuple[AnyStep, ...]:  # kernels resolved and admitted
        return tuple(self._step(i, s) for i, s in enumerate(steps))

    def _step(self, index: int, s: sp.StepArgs | CopyStep | ClearStep) -> AnyStep:
        if isinstance(s, (CopyStep, ClearStep)):  # read once by the wire, run as read
            return s
        return Step(self._source(index, s.kernel_id, s.entry_point, s.constants), s.params, s.workgroups, s.entry_point,
                    s.bind, s.input, s.output, s.output_size, s.grid, s.constants, s.buffers, s.outputs)

    def _chain_work(self, request: ChainRequest, chain_steps: tuple[AnyStep, ...] | None, key: tuple | None) -> Work:
        """The chain (its session looked up when it runs): on its shape's kit
        when one fits, else planned whole (its steps resolved then when
        `chain_steps` is None); its answer (chain_gather.answer_value)."""
        store, chains, ref = self.service.sessions, self.service.chains, request.ref

        def work(reader: bool) -> Any:
            session = store.get(*ref) if ref is not None else None
            try:
                # Only a repeat tries the kit: a request planned afresh (its kernel's
                # file changed, say) replaces the kit of its shape.
                result = chains.run_kit(key, session, request.data, request.steps, reader) if chain_steps is None else None
                if result is None:
                    found = chain_steps if chain_steps is not None else self._steps(request.steps)
                    chain = Chain(found, request.data, request.returns, session, request.metering.gas_limit,
                                  request.metering.max_bytes)
                    result = chains.run(chain, reader, key)
            except StepError as exc:
                raise _shaped(request.method, exc) from None
            return answer_value(result, request)

        return work

    def _small_chain(self, ref: tuple[int, int] | None, steps: list, chain_steps: tuple[AnyStep, ...], data: bytes) -> bool:
        """Short enough to run on the reader: little data, few steps, every kernel compiled
        (a compile takes tens of ms), none that may loop (port/lone_call.py)."""
        kernels = _kernels(steps)
        outputs = [s.output_size if s.output_size is not None else len(data) for s in kernels]
        outputs += [sum(s.outputs.values()) + sum(map(len, s.buffers.values())) for s in kernels]
        held = self.service.sessions.bytes_of(ref[1]) if ref is not None else 0
        pipelines = self.service.chains.pipelines
        return (
            len(steps) <= INLINE_STEPS
            and len(data) + sum(outputs) + held <= SMALL_CALL
            and all(pipelines.has(self.resolver.resolve_local(s.kernel_id), s.entry_point, s.params, s.constants) for s in kernels)
            and not any(may_loop(s.source.text, s.source.sha256, s.entry_point) for s in chain_steps if type(s) is Step)
        )

    def _source(self, index: int, kernel_id: str, entry: str, constants: tuple | None = None) -> KernelSource:
        resolver = self.resolver
        try:
            source = resolver.resolve_local(kernel_id) or resolver.fetch(kernel_id)
            return self.guard.admit_for_session(source, entry, constants, gas=True) if self.guard is not None else source
        except KemError as exc:
            if exc.reason == "shader_error":  # the admission worker's compile: name the kernel (issue 26)
                exc = KemError(exc.reason, named_shader(exc.detail, kernel_id))
            raise StepError(index, exc) from None

    # -- running and answering ----------------------------------------------

    def _answering(self, req_id: int, run: Callable[[], None]) -> Callable[[], None]:
        """`run` (on a fetch thread), its failure answered to the caller."""
        return lambda: self.replies.answering(req_id, run)

    def _submit(self, req_id: int, work: Work, small: bool = False, batch: tuple | None = None) -> None:
        """Run `work` on the GPU thread, or on this one when it is small and
        nothing else waits (as port/lone_call.py does for small calls:
        waking the GPU thread cost ~0.4 ms of a ~0.9 ms call on lavapipe).
        A chain whose plan proves too long for the reader (NotForReader,
        raised before anything is submitted) goes to the GPU thread after all."""

        @_tagged(req_id)
        def control(_executor: object) -> None:
            self._answering(req_id, lambda: self.replies.ok(req_id, self.service.run(lambda: work(False))))()

        longer: list[bool] = []

        def answer_inline() -> None:
            try:
                value = self.service.run(lambda: work(True))
            except NotForReader:
                longer.append(True)
                return
            self.replies.ok(req_id, value)

        @_tagged(req_id)
        def inline(_executor: object) -> None:
            self.replies.answering(req_id, answer_inline)

        # Session work keeps its order: none runs inline while earlier work is still
        # queued (the GPU thread takes an item a moment before the executor lock).
        if small and not self._queued and not self.input_waiting() and self.loop.run_control_inline(inline):
            if not longer:
                self.stats.inc("inline_session_calls")
                return
            self.stats.inc("session_calls_off_reader")

        @_tagged(req_id)
        def queued(executor: object) -> None:
            try:
                control(executor)
            finally:
                self.unqueue(1)

        if batch is not None:  # the GPU loop gathers those of one shape (gpu_loop._gather)
            gatherable(queued, batch, self)
        with self._queued_lock:
            self._queued += 1
        try:
            self.loop.put(queued)
        except QueueFull:
            self.unqueue(1)
            raise RequestError(req_id, KemError("overloaded", "the GPU queue is full")) from None


def _tagged(req_id: int) -> Callable[[Callable], Callable]:
    """Tag a control action with its ReqId, as a Job is: call_state then
    says queued or running for session work and chains too, so the node
    blames (and kills for) only work the GPU was inside (kem_timeout.erl)."""

    def tag(action: Callable) -> Callable:
        action.tag = req_id  # type: ignore[attr-defined]
        return action

    return tag


def _shaped(method: str, error: StepError) -> KemError:
    """session_call is one step: its failure is a plain {Reason, Detail}
    (docs/sessions.md), an admission's refusal too (it came back as a
    step's, #{step => 1, ...})."""
    return KemError(error.reason, error.detail) if method == "session_call" else error


def _kit_key(request: ChainRequest) -> tuple | None:
    """The request's shape (wire/session_protocol.shape_key), or None when
    its bytes alone pass what a kit may hold (chain_kit.KIT_BYTES)."""
    given = len(request.data)
    for s in _kernels(request.steps):
        given += len(s.params or b"") + (sum(map(len, s.buffers.values())) if s.buffers else 0)
    if given > KIT_BYTES:
        return None
    shapes: dict[int, tuple] = {}  # a step read once for its repeats (session_protocol.chain_steps) is keyed once
    return (request.method, request.ref, given, len(request.data), request.returns, request.metering,
            tuple(shapes.get(id(s)) or shapes.setdefault(id(s), sp.shape_key(s)) for s in request.steps))


def _small_kit(kit: ChainKit) -> bool:
    """A kit short enough for the reader, by the rule _small_chain applies before a plan exists."""
    return kit.steps <= INLINE_STEPS and kit.invocations <= READER_INVOCATIONS and kit.held + kit.bytes <= SMALL_CALL


def _kernels(steps: list) -> list[sp.StepArgs]:
    """The kernel steps (not copies or clears)."""
    return [s for s in steps if isinstance(s, sp.StepArgs)]


def _all_admitted(guard: CompileGuard | None, resolver: KernelResolver, steps: list) -> bool:
    """Whether every step's kernel is local and already admitted for sessions."""
    if guard is None:
        return True
    sources = [(resolver.resolve_local(s.kernel_id), s) for s in _kernels(steps)]
    return all(src is not None and guard.is_admitted_for_session(src, s.entry_point, s.constants, gas=True) for src, s in sources)
