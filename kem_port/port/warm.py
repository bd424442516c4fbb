"""Warm kernels: compile, before serving, the kernels a port group served last.

The node keeps a bounded list of the kernel shapes its ports served
(``{KernelId, EntryPoint, WithParams}``, erlang/kem/src/kem_warm.erl) and
sends it in a ``warm`` call to a new spare or a restarted port before it
says ready, so the first calls after a restart find their pipelines
compiled. Pinned kernels (``KEM_PINS``) already in the local cache are
added. Each shape is compiled through the same pipeline cache the calls
use (gpu/pipelines.py), on the GPU thread, after the same admission
(admission/guard.py). A kernel that is unknown, not
local (warming never fetches) or fails to compile is skipped and logged:
warming is an optimisation, never a reason to refuse to start.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kem_port.admission.guard import CompileGuard
from kem_port.errors import KemError, bad_args
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.kernel_store import KernelResolver, KernelSource
from kem_port.port.gpu_loop import GpuLoop, QueueFull
from kem_port.port.replies import Replies
from kem_port.wire.protocol import ENTRY_POINT, KERNEL_ID, RequestError
from kem_port.wire.terms import atom_name, binary_bytes

log = logging.getLogger("kem_port.warm")

MAX_SHAPES = 1024  # an upper bound on one request's list, checked before any work
WARM_PARAMS = bytes(16)  # stands for "called with params": only its presence shapes the pipeline


@dataclass(frozen=True)
class Shape:
    kernel_id: str
    entry_point: str = "main"
    with_params: bool = False


def _text(value: Any) -> str | None:
    name = atom_name(value)
    if name is not None and not isinstance(value, bool) and value is not None:
        return name
    raw = binary_bytes(value)
    return raw.decode("ascii", "replace") if raw is not None else None


def parse_shapes(args: tuple) -> list[Shape]:
    """``{[{KernelId, EntryPoint, WithParams}]}`` → shapes; malformed
    entries are a clear ``bad_args`` (they come from our own node)."""
    if len(args) != 1 or not isinstance(args[0], list):
        raise bad_args("warm takes {[{KernelId, EntryPoint, WithParams}]}")
    entries = args[0]
    if len(entries) > MAX_SHAPES:
        raise bad_args(f"warm takes at most {MAX_SHAPES} kernels")
    shapes = []
    for entry in entries:
        if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[2], bool)):
            raise bad_args("each warm entry is {KernelId, EntryPoint, WithParams :: boolean()}")
        kid, entry_point = _text(entry[0]), _text(entry[1])
        if kid is None or not KERNEL_ID.fullmatch(kid) or entry_point is None or not ENTRY_POINT.fullmatch(entry_point):
            raise bad_args("warm entry: a kernel id and an entry point name")
        shapes.append(Shape(kid, entry_point, entry[2]))
    return shapes


def pinned_shapes(resolver: KernelResolver) -> list[Shape]:
    """Pinned kernels (entry ``main``, no params): compiled only if cached locally."""
    pins = getattr(resolver.remote, "pins", None) or {}
    return [Shape(kernel_id) for kernel_id in sorted(pins)]


def request(req_id: int, args: tuple, resolver: KernelResolver, loop: GpuLoop, guard: CompileGuard | None,
            replies: Replies) -> None:
    """The ``warm`` method: the given shapes and the pinned ones, admitted
    (admission/guard.py: a worker round trip each, so on a thread of its
    own, never the reader or the GPU thread) and then compiled on the GPU
    thread; the reply (counts) comes when all are done."""
    try:
        shapes = parse_shapes(args) + pinned_shapes(resolver)
    except KemError as exc:
        raise RequestError(req_id, exc) from None

    def admit_then_compile() -> None:
        ready, skipped = _admit_all(shapes, resolver, guard)
        try:
            loop.put(warm_action(ready, skipped, resolver, lambda counts: replies.ok(req_id, counts)))
        except QueueFull:
            replies.error(req_id, KemError("overloaded", "the GPU queue is full"))

    threading.Thread(target=admit_then_compile, name="kem-warm", daemon=True).start()


def _admit_all(shapes: list[Shape], resolver: KernelResolver, guard: CompileGuard | None) -> tuple[list, int]:
    """(call, admitted source) for each shape that is local and admitted;
    how many were skipped. Admission is what every call goes through: the
    port compiles nothing it has not admitted (possibly rewritten)."""
    ready, skipped = [], 0
    for shape in dict.fromkeys(shapes):  # in order, once each
        call = KernelCall(shape.kernel_id, b"", 0, WARM_PARAMS if shape.with_params else None, entry_point=shape.entry_point)
        try:
            source = resolver.resolve_local(shape.kernel_id)
            if source is None:
                log.info("warm: %s is not local; skipped", shape.kernel_id)
                skipped += 1
                continue
            ready.append((call, guard.admit(source, call) if guard is not None else source))
        except KemError as exc:
            log.warning("warm: %s:%s skipped: %s", shape.kernel_id, shape.entry_point, exc)
            skipped += 1
        except Exception as exc:  # never a reason for a port not to start
            log.warning("warm: %s:%s skipped: %s: %s", shape.kernel_id, shape.entry_point, type(exc).__name__, exc)
            skipped += 1
    return ready, skipped


def warm_action(ready: list, skipped: int, resolver: KernelResolver, done: Callable[[dict], None]) -> Callable[[Executor], None]:
    """A control action for the GPU loop: compile each admitted shape, then
    call ``done`` with the counts."""

    def run(executor: Executor) -> None:
        counts = {"compiled": 0, "cached": 0, "skipped": skipped}
        for call, source in ready:
            counts[_compile(call, source, executor)] += 1
        if not executor.stats.snapshot()["batch_sizes"]:  # nothing has run on this device yet
            _first_dispatch(resolver, executor)
        done(counts)

    return run


def _first_dispatch(resolver: KernelResolver, executor: Executor) -> None:
    """Run one tiny call of the packaged ``double`` kernel through the
    executor. A port's first batch costs far more than its compile: on
    lavapipe a warmed kernel's first call took 700 ms, the next 0.7 ms
    (buffer pool, staging map, the driver's first submit)."""
    source = resolver.resolve_local("double")
    if source is None or executor.gpu.device is None:
        return
    call = KernelCall("double", bytes(4), 4)
    job = Job(call, source, reply=lambda _view: None, fail=lambda err: log.warning("warm: first dispatch failed: %s", err))
    try:
        executor.run([job])
    except Exception as exc:
        log.warning("warm: first dispatch failed: %s: %s", type(exc).__name__, exc)


def _compile(call: KernelCall, source: KernelSource, executor: Executor) -> str:
    try:
        if executor.is_warm(source, call):
            return "cached"
        executor.pipelines.get(executor.gpu.require(), source, call)
        return "compiled"
    except KemError as exc:
        log.warning("warm: %s:%s skipped: %s", call.kernel_id, call.entry_point, exc)
    except Exception as exc:  # a driver error must not stop the port from starting
        log.warning("warm: %s:%s skipped: %s: %s", call.kernel_id, call.entry_point, type(exc).__name__, exc)
    return "skipped"
