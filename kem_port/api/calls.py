"""The API's functions on a shared :class:`~kem_port.api.runner.Runner`:
:func:`run`, :func:`run_named`, :func:`run_debug`, :func:`health` and
:func:`adapters`, each what the Erlang API's call of the same name does,
in this process."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kem_port.api import named
from kem_port.api.runner import Runner
from kem_port.api.values import Input, Params, input_bytes, params_bytes, shape_output
from kem_port.errors import KemError

_default: Runner | None = None
_default_lock = threading.Lock()


def default_runner() -> Runner:
    """The Runner :func:`run` uses, made (from the environment) on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runner()
        return _default


def run(
    kernel: str | Path,
    input: Input,
    *,
    output_size: int | None = None,
    hint: int = 1,
    params: Params = None,
    workgroups: tuple[int, int, int] | None = None,
    entry_point: str = "main",
    dtype: Any = None,
    out_shape: Sequence[int] | None = None,
    grid: tuple[int, int, int] | None = None,
    constants: Mapping[str, int | float] | None = None,
    gas_limit: int | None = None,
    runner: Runner | None = None,
) -> np.ndarray | bytes:
    """Run a kem kernel once and return its output.

    kernel: a path to a ``.wgsl`` file, or a kernel id (``"double"``, a name
        in ``KEM_KERNEL_DIR``, or a 43-character Arweave ID, fetched and
        verified under ``KEM_VERIFY``).
    input: bytes-like, or a numpy array (its raw bytes, C order). Bound at
        binding 0, zero-padded to whole 32-bit words.
    output_size: exact output bytes; else ``len(input bytes) * hint``.
    params: bytes, a numpy array, or a sequence of ints (packed as
        little-endian u32 words); bound as the uniform at binding 2.
    workgroups: ``(x, y, z)``, overriding kem's dispatch rule (docs/dispatch.md).
    grid: ``(x, y, z)`` invocations; kem divides by the workgroup size,
        rounding up (not with ``workgroups``).
    constants: ``{name: number}`` for the kernel's ``override`` declarations
        (docs/kernels.md).
    entry_point: the ``@compute`` function to run.
    dtype: return a numpy array of this dtype. Without it, a numpy input
        gives a numpy output of the input's dtype, and bytes give bytes.
    out_shape: the returned array's shape. Without it, an output of the
        input's size and dtype takes the input's shape (an ``(h, w, 4)``
        image in, an ``(h, w, 4)`` image out); any other output is flat.
    gas_limit: the call's gas budget (invocations launched + loop iterations,
        docs/metering.md); default ``KEM_GAS_LIMIT``. Past it: KemError
        ``gas_exhausted``. The call's gas is then ``runner.gas``
        (:func:`default_runner` for the shared one).
    runner: the Runner to use (its own settings); default: a shared one.

    Raises :class:`kem_port.errors.KemError` (``.reason``, ``.detail``) with
    the same reasons the port answers, e.g. ``shader_error``, ``bad_kernel``,
    ``too_large``, ``kernel_not_found``, ``no_adapter``.
    """
    return (runner or default_runner()).run(
        kernel, input, output_size=output_size, hint=hint, params=params, workgroups=workgroups,
        entry_point=entry_point, dtype=dtype, grid=grid, constants=constants, out_shape=out_shape, gas_limit=gas_limit,
    )


def run_named(kernel: str | Path, buffers: Mapping, outputs: Mapping | None = None, **options: Any) -> dict[str, np.ndarray]:
    """Any kernel by named buffers (docs/kernels.md), numpy in by WGSL name,
    numpy out shaped by ``outputs`` (a byte count or ``(shape, dtype)``) or by
    the in/out array given: :func:`kem_port.api.named.run_named`, on the
    shared Runner unless ``runner=`` names one."""
    return named.run_named(kernel, buffers, outputs, runner=options.pop("runner", None) or default_runner(), **options)


@dataclass(frozen=True)
class DebugRun:
    """A debug call's answer: the output, shaped as :func:`run` shapes it,
    the u32 records the kernel wrote to its debug channel (binding 15,
    docs/debug.md), how many did not fit, and the call's gas (docs/metering.md)."""

    output: np.ndarray | bytes
    records: list[int]
    dropped: int
    gas: int = 0


def run_debug(kernel: str | Path, input: Input, *, runner: Runner | None = None, dtype: Any = None,
              out_shape: Sequence[int] | None = None, **options: Any) -> DebugRun:
    """Run a kernel that declares kem's debug channel once, with the channel
    bound (``debug => true`` in Erlang); ``options`` as :func:`run` takes them."""
    runner = runner or default_runner()
    source = runner.source(kernel)
    options["params"] = params_bytes(options.get("params"))
    call = runner.call(source, input_bytes(input), debug=True, **options)
    runner.compile(source, call)
    out, debug = runner.execute_debug(source, call)
    return DebugRun(shape_output(out, input, dtype, out_shape), [int(r) for r in debug["records"]], int(debug["dropped"]),
                    int(debug.get("gas", 0)))


def health(runner: Runner | None = None) -> dict[str, Any]:
    """The adapter this process would run on, as ``kem:health()`` words it:
    ``usable``, ``adapter``, ``kind`` (``gpu``, ``cpu``...), ``backend`` and
    ``reason`` (why a CPU adapter, or why none; None on a GPU)."""
    from kem_port.port.health import Health

    runner = runner or default_runner()
    try:
        executor, error = runner.executor, None
    except KemError as exc:
        from kem_port.api.gpu import gpu_layer

        executor, error = gpu_layer().Executor(runner.config, runner.stats), exc
    # Health logs the CPU fall-back for a port's operator; asked here, the
    # answer is the reply itself, so the log line stays quiet.
    quiet = logging.getLogger("kem_port.health")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return Health(executor, runner.config, error).describe()
    finally:
        quiet.setLevel(level)
