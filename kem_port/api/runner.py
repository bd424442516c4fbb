"""The :class:`Runner`: one executor (one device, its compiled pipelines,
its buffer pool) and the port's kernel resolver and admission guard, for
running kernels in this process, no Erlang and no port process.

A kernel is a path to a ``.wgsl`` file or a kernel id, resolved exactly as
the port resolves it (``KEM_KERNEL_DIR``, the packaged examples, then
Arweave through ``KEM_GATEWAYS`` under ``KEM_VERIFY``). Every argument goes
through the port's own checks (protocol.py) and every GPU step through the
port's own :class:`~kem_port.gpu.executor.Executor`, so a kernel that runs here
runs the same way in a node.

Every kernel is admitted as the port admits it (admission/guard.py: the
contract, structural limits, workgroup clearing, the first compile in the
sacrificial worker), so one that would crash the shader compiler is
``kernel_rejected`` here too (``kem check`` died by SIGSEGV on 3,000 nested
parentheses before issue 24). Refusals are remembered for the Runner's
life only: a developer's machine should not decide for a node.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kem_port.config import Config
from kem_port.api.gpu import gpu_layer
from kem_port.api.values import Input, Params, checked_call, file_kernel_id, input_bytes, params_bytes, shape_output
from kem_port.errors import KemError
from kem_port.kernel_store import KernelResolver, KernelSource, default_stores, source_from_bytes
from kem_port.wire.protocol import KernelCall
from kem_port.stats import Stats


@dataclass
class Timings:
    """Seconds spent by the last call of a :class:`Runner`, per stage."""

    device_open: float = 0.0
    fetch: float = 0.0
    compile: float = 0.0
    run: float = 0.0

    def lines(self) -> list[str]:
        return [f"{name.replace('_', ' ')}: {secs * 1e3:.1f} ms" for name, secs in vars(self).items() if secs]


@dataclass
class Runner:
    """Owns one executor (one device) and the kernel resolver; thread-safe.

    ``config`` defaults to the ``KEM_*`` environment, as the port reads it.
    """

    config: Config = field(default_factory=Config.from_env)
    stats: Stats = field(default_factory=Stats)
    timings: Timings = field(default_factory=Timings)
    gas: int | None = None  # the last call's gas: invocations launched + loop iterations (docs/metering.md)

    def __post_init__(self) -> None:
        self._executor: Any = None
        self._resolver: KernelResolver | None = None
        self._guard: Any = None
        self._lock = threading.RLock()  # one device: opening, compiling and runs take turns

    # -- the parts, opened on first use ------------------------------------

    @property
    def executor(self) -> Any:
        """The executor, its device opened (raises KemError no_adapter)."""
        with self._lock:
            if self._executor is None:
                started = time.perf_counter()
                executor = gpu_layer().Executor(self.config, self.stats)
                executor.open()
                self.timings.device_open = time.perf_counter() - started
                self._executor = executor
            return self._executor

    @property
    def resolver(self) -> KernelResolver:
        from kem_port.port.server import build_remote

        with self._lock:
            if self._resolver is None:
                self._resolver = KernelResolver(default_stores(self.config.kernel_dir), build_remote(self.config, self.stats))
            return self._resolver

    @property
    def guard(self) -> Any:
        """The admission guard (a CompileGuard), its worker started on the
        first kernel that needs it; refusals kept in memory only."""
        from kem_port.admission.guard import guard_from_config

        with self._lock:
            if self._guard is None:
                self._guard = guard_from_config(dataclasses.replace(self.config, cache_dir=None), self.stats)
            return self._guard

    def admit(self, source: KernelSource, call: KernelCall) -> KernelSource:
        """The source this process may compile for the call, as the port
        admits it (its rewritten text included); KemError ``kernel_rejected``
        for one that crashed or exhausted the compile worker."""
        return self.guard.admit(source, call)

    def close(self) -> None:
        """Stop the compile worker (it also exits when this process does)."""
        with self._lock:
            if self._guard is not None:
                self._guard.close()
                self._guard = None

    def source(self, kernel: str | Path) -> KernelSource:
        """A kernel's source: a ``.wgsl`` path, else an id (local, packaged, Arweave)."""
        path = Path(kernel)
        # Ids are [A-Za-z0-9_-] only: anything with a dot or a slash is a file.
        if isinstance(kernel, Path) or any(c in str(kernel) for c in "./"):
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise KemError("kernel_not_found", f"{kernel}: {exc.strerror}") from None
            return source_from_bytes(file_kernel_id(path), data, str(path), "local")
        kernel_id = str(kernel)
        found = self.resolver.resolve_local(kernel_id)
        if found is not None:
            return found
        started = time.perf_counter()
        try:
            return self.resolver.fetch(kernel_id)
        finally:
            self.timings.fetch = time.perf_counter() - started

    # -- calls ---------------------------------------------------------------

    def call(
        self,
        source: KernelSource,
        data: bytes,
        *,
        output_size: int | None = None,
        hint: int = 1,
        params: bytes | None = None,
        workgroups: Sequence[int] | None = None,
        entry_point: str = "main",
        debug: bool = False,
        grid: Sequence[int] | None = None,
        constants: Mapping[str, int | float] | None = None,
        gas_limit: int | None = None,
    ) -> KernelCall:
        """A KernelCall checked by the port's own rules (protocol.kernel_call)."""
        return checked_call(self.config, source.kernel_id, data, output_size=output_size, hint=hint, params=params,
                            workgroups=workgroups, entry_point=entry_point, debug=debug, grid=grid, constants=constants,
                            gas_limit=gas_limit)

    def compile(self, source: KernelSource, call: KernelCall) -> Any:
        """Check the kernel against kem's contract and compile it (naga); the Pipeline."""
        with self._lock:
            executor = self.executor
            started = time.perf_counter()
            pipeline = gpu_layer().compile(executor, self.admit(source, call), call)
            self.timings.compile = time.perf_counter() - started
            return pipeline

    def dispatch(self, source: KernelSource, call: KernelCall) -> tuple[int, int, int]:
        """The workgroup counts kem would dispatch for this call."""
        gpu = gpu_layer()
        pipeline = self.compile(source, call)
        return gpu.plan_dispatch(pipeline.entry, call.output_size, call.param_words, call.workgroups, gpu.dispatch_limits(self.executor), call.grid)

    def dispatch_rule(self, source: KernelSource, call: KernelCall) -> str:
        """Which rule sizes this call's dispatch (docs/dispatch.md): grid, workgroups, image, 1-D, or none."""
        return gpu_layer().dispatch_rule(self.compile(source, call).entry, call.workgroups, call.grid)

    def execute_debug(self, source: KernelSource, call: KernelCall) -> tuple[bytes, dict]:
        """Run one call made with ``debug=True``: its output and the records
        its kernel wrote to the debug channel (docs/debug.md)."""
        gpu = gpu_layer()
        job = gpu.Job(call=call, source=self.admit(source, call), reply=lambda view: None, fail=lambda error: None)
        with self._lock:
            started = time.perf_counter()
            result = gpu.run_debug(self.executor, job)
            self.timings.run = time.perf_counter() - started
        self.gas = result[1].get("gas")
        return result

    def execute(self, source: KernelSource, call: KernelCall) -> bytes:
        """Run one checked call on the GPU (compiling first if needed); its output bytes."""
        answer: list[bytes] = []
        failure: list[KemError] = []
        admitted = self.admit(source, call)
        job = gpu_layer().Job(call=call, source=admitted, reply=lambda view: answer.append(bytes(view)), fail=failure.append)
        with self._lock:
            started = time.perf_counter()
            self.executor.run([job])
            self.timings.run = time.perf_counter() - started
        self.gas = job.gas
        if failure:
            raise failure[0]
        return answer[0]

    def run(
        self,
        kernel: str | Path,
        input: Input,
        *,
        output_size: int | None = None,
        hint: int = 1,
        params: Params = None,
        workgroups: tuple[int, int, int] | None = None,
        entry_point: str = "main",
        dtype: Any = None,
        grid: tuple[int, int, int] | None = None,
        constants: Mapping[str, int | float] | None = None,
        out_shape: Sequence[int] | None = None,
        gas_limit: int | None = None,
    ) -> np.ndarray | bytes:
        """See :func:`kem_port.api.run`."""
        self.timings, self.gas = Timings(), None
        data = input_bytes(input)
        source = self.source(kernel)
        call = self.call(
            source, data, output_size=output_size, hint=hint, params=params_bytes(params),
            workgroups=workgroups, entry_point=entry_point, grid=grid, constants=constants, gas_limit=gas_limit,
        )
        self.compile(source, call)
        out = self.execute(source, call)
        return shape_output(out, input, dtype, out_shape)

