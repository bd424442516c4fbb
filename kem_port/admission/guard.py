"""Admission of kernels: nothing the port has not seen compile is compiled by it.

A 6 KB kernel could crash the port on every call (naga recursed off the
compiling thread's stack: SIGSEGV), and small "compile bombs" grew the port
by hundreds of MB a second. So before the port compiles a pipeline it has
not admitted (kernel sha256, entry point, with or without params, and the
call's pipeline constants when it has any):

1. the kernel's hash is looked up among kernels refused before (on disk,
   admission/rejects.py): refused at once, with the reason;
2. cheap structural limits on its syntax tree (admission/limits.py);
3. its gas form (gpu/wgsl/wgsl_gas.py) and, on an adapter that leaks
   workgroup memory, the clearing (admission/zeroing.py): that text is what
   the worker, and then the port, compiles;
4. a compile in the warm sacrificial worker (admission/worker.py) under
   stack, memory and CPU-time limits (a wall deadline of 3x the CPU budget
   as a backstop). A compile error is the caller's ``shader_error``/
   ``bad_kernel``; a worker that spent the CPU budget refuses the kernel
   (``kernel_rejected``, remembered by hash on disk); one that died, missed
   the deadline or broke gets it again in a fresh worker (_confirm) first.

Constants are admitted with the kernel (an override can size a workgroup,
an array or a loop). A call without constants keeps the 3-part key the lone
road looks up (port/lone_call.py); one with constants is admitted for its
set only. Admissions are remembered in memory (``is_admitted``: one
lookup); kernels packaged with kem skip the worker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

from kem_port.errors import KemError
from kem_port.gpu.constants import pipeline_constants, set_key
from kem_port.gpu.contract import check_layout
from kem_port.gpu.calls import KernelCall
from kem_port.kernel_store import PACKAGED_KERNELS, KernelSource
from kem_port.admission.admitted import Admitted
from kem_port.admission.rejects import RejectStore
from kem_port.admission.limits import check_structure
from kem_port.gpu.wgsl.wgsl_reflect import reflect
from kem_port.gpu.wgsl.wgsl_calls import may_loop
from kem_port.gpu.wgsl.wgsl_gas import gas_form, named_gas_form
from kem_port.admission.worker_client import CompileWorker, GuardSettings, WorkerDied, WorkerSlot
from kem_port.admission.zeroing import compiled_text

log = logging.getLogger("kem_port.admission.guard")

FAILED_CACHE = 1024  # compile errors remembered in memory (cheap to redo)
HEALTH_KERNEL = PACKAGED_KERNELS / "double.wgsl"  # compiled to check the worker after a failure
SESSION = "session"  # the third part of the key of a kernel admitted for sessions and chains, as written
SESSION_GAS = "session-gas"  # ... as its gas form at its own gas group: named-buffer runs (docs/metering.md)


@dataclass(frozen=True)
class Outcome:
    """One compile in the worker: admitted (all None), the caller's compile
    error, or failed: why the worker died, ran out of time or broke."""

    error: KemError | None = None
    failed: str | None = None
    conclusive: bool = False  # failed by spending its CPU budget: no second try


class CompileGuard:
    def __init__(self, settings: GuardSettings, rejects: RejectStore, stats=None) -> None:
        self.settings = settings
        self.rejects = rejects
        self.stats = stats
        self._admissions = Admitted()  # keys with a constants set in an LRU (admission/admitted.py)
        self._admitted = self.admitted = self._admissions.plain  # .admitted: the reader's lone road's (port/lone_call.py) one lookup
        self._failed: OrderedDict[tuple[str, str, bool], KemError] = OrderedDict()
        # One admitted text per kernel (sha256, cleared or not), shared by its
        # entry points and shapes: a chain names any entry point, and a copy
        # each grew the port by the kernel's size per name (1 MiB kernel:
        # ~4-6 MB an admission, issue 24's third red team).
        self._texts: dict[tuple[str, bool, int | None], str] = {}  # (sha256, cleared, the gas meter's group or None)
        self._slot = WorkerSlot(settings, lambda seconds: self._time("compile_worker_open", seconds))
        self._lock = threading.Lock()  # one compile at a time: one worker
        self._fault: str | None = None  # test_hooks.py's fail_next_compile (KEM_TEST_HOOKS=1)

    # -- the hot path -----------------------------------------------------

    def is_admitted(self, source: KernelSource, call: KernelCall) -> KernelSource | None:
        """The admitted (possibly rewritten) source, or None: one dict lookup (the hot road stays in this module)."""
        return self._admitted.get(key) if len(key := _key(source, call)) <= 3 else self._admissions.get(key)

    # -- admission --------------------------------------------------------

    def admit(self, source: KernelSource, call: KernelCall) -> KernelSource:
        """The source the port may compile for this call's pipeline, or
        KemError. Blocks for one worker round trip the first time: call it
        off the reader and GPU threads."""
        return self._admit(_key(source, call), source, lambda: check_layout(reflect(source.text), call))

    def is_admitted_for_session(self, source: KernelSource, entry: str, constants: tuple | None = None, gas: bool = False):
        """Like is_admitted, for a kernel run in a session or chain, or by named buffers."""
        return self._admissions.get(_admission_key(source, entry, SESSION_GAS if gas else SESSION, constants))

    def admit_for_session(self, source: KernelSource, entry: str, constants: tuple | None = None, gas: bool = False) -> KernelSource:
        """admit() for a session, chain or named-buffer kernel (its own layout), per constants set; gas:
        its gas form, metered at its own gas group (wgsl_gas.named_gas_form: what a named run compiles)."""
        return self._admit(_admission_key(source, entry, SESSION_GAS if gas else SESSION, constants), source, lambda: None)

    def _admit(self, key: tuple, source: KernelSource, check_contract) -> KernelSource:
        found = self._admissions.get(key)
        if found is not None:
            return found
        refused = self.rejects.lookup(source.sha256)
        if refused is not None:
            self._count("kernels_refused")
            raise KemError("kernel_rejected", f"kernel {source.kernel_id} was refused before: {refused}")
        # kem's own contract (bindings, entry point): the same clear errors
        # the executor gives, before any compile.
        check_contract()
        # Whether the author's code may loop, decided here, off the reader and
        # GPU threads, on the text before kem's clearing adds its own bounded
        # loop: the inline road and batching (gpu/blame.py, under the queue's
        # lock) then find it with one dict lookup, the same answer for every
        # text of this kernel (they all share its sha256).
        may_loop(source.text, source.sha256, key[1])
        if _packaged(source):
            self._admissions.put(key, source)
            return source
        with self._lock:
            found = self._admissions.get(key) or self._failed.get(key)
            if isinstance(found, KemError):
                raise found
            if found is not None:
                return found
            return self._admit_new(key, source)

    def _admit_new(self, key, source: KernelSource) -> KernelSource:
        _, entry, shape = key[:3]
        try:
            check_structure(source.text)
        except KemError as exc:
            self._rejected(source, exc.detail)  # remembered; the limit's own refusal is raised
            raise
        worker = self._ready_worker()
        clear = self.settings.zero_workgroup == "on" or (self.settings.zero_workgroup == "auto" and worker.leaks_workgroup)
        tkey, text = _text(self._texts, source, shape, clear)
        request = {"code": text, "entry": entry, "has_params": shape, "kernel_id": source.kernel_id}
        if shape in (SESSION, SESSION_GAS):
            request.update(has_params=False, layout="auto")
        if len(key) > 3:  # the very constants the port will compile with (gpu/pipelines.py)
            request["constants"] = pipeline_constants(reflect(source.text), key[3])
        if self._fault is not None:
            request, self._fault = {**request, "test_fail": self._fault}, None
        outcome = self._attempt(worker, request)
        if outcome.failed is not None and not outcome.conclusive:
            outcome = self._confirm(source, {k: v for k, v in request.items() if k != "test_fail"}, outcome)
        if outcome.failed is not None:
            if len(key) <= 3:  # a constants set that broke the compiler is refused alone (red team: N = 2^28 - 1 had every set refused, on disk)
                raise self._rejected(source, outcome.failed)
            outcome = replace(outcome, error=KemError("kernel_rejected", f"kernel {source.kernel_id} {outcome.failed}"))
        if outcome.error is not None:
            self._failed[key] = outcome.error
            while len(self._failed) > FAILED_CACHE:
                self._failed.popitem(last=False)
            raise outcome.error
        admitted = replace(source, text=self._texts.setdefault(tkey, text), metered=None if shape == SESSION else tkey[2] is not None)
        self._admissions.put(key, admitted)
        self._count("kernels_admitted")
        return admitted

    def _attempt(self, worker: CompileWorker, request: dict) -> Outcome:
        """One compile of request in worker, read as an Outcome; a worker
        that died, timed out or broke is retired and a new one started."""
        started = time.perf_counter()
        try:
            reply = worker.compile(request)
        except WorkerDied as died:
            self._retire(worker)
            return Outcome(failed=died.why, conclusive=died.cpu_exhausted)
        finally:
            self._time("guard_compile", time.perf_counter() - started)
        if reply.get("ok"):
            return Outcome()
        if not self._still_compiles(worker):
            # On the H100 a kernel that exhausts the worker's memory limit
            # fails as a validation error and leaves the worker unable to
            # compile anything after it: a kernel that breaks the worker is
            # refused like one that kills it, and the worker replaced.
            return Outcome(failed="exhausted the compile worker's resource limits")
        return Outcome(error=KemError(str(reply.get("reason", "bad_kernel")), str(reply.get("detail", ""))))

    def _confirm(self, source: KernelSource, request: dict, first: Outcome) -> Outcome:
        """A refusal is for good, so a failure that load or a worn worker
        could cause (a wall deadline missed, a crash or a broken worker in a
        worker that compiled others before) is confirmed first: the kernel is
        compiled again, alone, in a fresh worker, and only a second failure
        refuses it. A kernel that spent its CPU budget needs no second try
        (conclusive): CPU time is what a bomb burns and what load cannot
        steal, and a second try would double the CPU a stranger's salted
        bombs cost the node."""
        log.warning("kernel %s %s; compiling it again in a fresh worker before refusing it", source.kernel_id, first.failed)
        self._count("compiles_retried")
        try:
            worker = self._ready_worker()
        except KemError:
            # Neither a refusal nor an admission: nothing is remembered.
            raise KemError("overloaded", f"kernel {source.kernel_id} could not be checked now (the compile worker "
                           f"{first.failed} and no fresh worker started); it is not refused: try again later") from None
        return self._attempt(worker, request)

    def _still_compiles(self, worker: CompileWorker) -> bool:
        """After a failed compile: does the worker still compile a known-good
        kernel? If not it is replaced (one more round trip, ~10 ms)."""
        try:
            healthy = bool(worker.compile({"code": HEALTH_KERNEL.read_text(), "entry": "main", "has_params": False}).get("ok"))
        except WorkerDied:
            healthy = False
        if not healthy:
            self._retire(worker)
        return healthy

    def _rejected(self, source: KernelSource, why: str) -> KemError:  # remembered by its hash, on disk
        log.warning("kernel %s (sha256 %s) refused: %s", source.kernel_id, source.sha256, why)
        self._count("kernels_rejected")
        self.rejects.remember(source.sha256, why)
        return KemError("kernel_rejected", f"kernel {source.kernel_id} {why}")

    def fail_next_compile(self, fault: str) -> None:
        """KEM_TEST_HOOKS=1 only: the next first compile fails ("crash", "stall" or "break")."""
        self._fault = fault

    # -- the worker's life (worker_client.WorkerSlot) ---------------------

    def start(self) -> None:
        """Start the worker in the background (it opens its own device)."""
        self._slot.respawn()

    @property
    def _worker(self) -> CompileWorker | None:
        return self._slot.worker

    def _ready_worker(self) -> CompileWorker:
        return self._slot.ready()

    def _retire(self, worker: CompileWorker) -> None:
        self._slot.retire(worker)

    def describe(self) -> dict:
        worker = self._worker
        return {"kernels_admitted": len(self._admitted), "admitted_constants_sets": len(self._admissions.sets),
                "workgroup_zeroing": self.settings.zero_workgroup if worker is None
                else ("on" if self.settings.zero_workgroup == "on" or (self.settings.zero_workgroup == "auto" and worker.leaks_workgroup) else "off"),
                "adapter_leaks_workgroup_memory": None if worker is None else worker.leaks_workgroup}

    def close(self) -> None:
        self._slot.close()

    def _count(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc(name)

    def _time(self, name: str, seconds: float) -> None:
        if self.stats is not None:
            self.stats.add_time(name, seconds)


def _key(source: KernelSource, call: KernelCall) -> tuple:
    return _admission_key(source, call.entry_point, call.params is not None, call.constants)


def _admission_key(source: KernelSource, entry: str, kind: bool | str, constants: tuple | None) -> tuple:
    """What one admission covers (the module doc): the constants set only when there is one."""
    base = (source.sha256, entry, kind)
    return base if not constants else base + set_key(constants)


def _text(texts: dict, source: KernelSource, kind: bool | str, clear: bool) -> tuple[tuple, str]:
    """(its key, the text admitted and run): the gas form (a call's at group 1, a named run's
    at its gas group), then kem's clearing (uncounted); one copy per kernel and form."""
    form = None if kind == SESSION else named_gas_form(source.text) if kind == SESSION_GAS else gas_form(source.text)
    tkey = (source.sha256, clear, form.group if form is not None and form.metered else None)
    text = texts.get(tkey)
    return tkey, text if text is not None else compiled_text(form.text if tkey[2] is not None else source.text, clear, False)


def _packaged(source: KernelSource) -> bool:
    return source.tier == "local" and os.path.dirname(source.origin) == str(PACKAGED_KERNELS)


def guard_from_config(config, stats=None) -> CompileGuard:
    directory = Path(config.cache_dir) / "rejected" if config.cache_dir else None
    settings = GuardSettings(
        timeout_s=config.compile_timeout_s,
        memory_mb=config.compile_memory_mb,
        zero_workgroup=config.zero_workgroup,
        adapter=config.adapter,
    )
    return CompileGuard(settings, RejectStore(directory), stats)
