"""Any kernel by named buffers from Python (issue 25), numpy in and out, in
the spirit of wgpu-py's ``compute_with_buffers``::

    import numpy as np
    from kem_port import api

    a, b = np.ones(1000, np.float32), np.arange(1000, dtype=np.float32)
    out = api.run_named("add.wgsl", {"a": a, "b": b}, outputs={"c": ((1000,), np.float32)},
                        grid=(1000, 1, 1))
    assert (out["c"] == a + b).all()

Buffers are keyed as the port keys them (gpu/named/binding_model.py): the
WGSL variable's name, ``"G/B"`` or a binding number of group 0. An output
is sized by ``outputs``: a byte count, or ``(shape, dtype)``, which also
shapes the array returned; an in/out buffer given as an array comes back
with its shape and dtype. The call goes through the port's own checks,
admission (the sacrificial compile) and GPU code (gpu/named/named_run.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from kem_port.api.values import from_gpu, input_bytes
from kem_port.errors import bad_args
from kem_port.wire import terms
from kem_port.wire.run_requests import read_run

Output = Union[int, tuple[Any, Any]]  # bytes, or (shape, dtype)


def run_named(kernel: str | Path, buffers: Mapping[str | int, Any], outputs: Mapping[str | int, Output] | None = None,
              *, runner: Any, workgroups: tuple[int, int, int] | None = None, grid: tuple[int, int, int] | None = None,
              constants: Mapping[str, int | float] | None = None, entry_point: str = "main") -> dict[str, np.ndarray]:
    """The kernel's returned buffers (outputs and in/outs) by WGSL name, as
    numpy arrays, run on ``runner`` (a :class:`kem_port.api.Runner`;
    ``kem_port.api.run_named`` uses the shared one); KemError (reason,
    detail) for anything the port refuses."""
    source = runner.source(kernel)
    outputs = dict(outputs or {})
    opts = {"outputs": {_key(k): _size(v) for k, v in outputs.items()}, "entry_point": entry_point.encode(),
            "workgroups": workgroups and tuple(workgroups), "grid": grid and tuple(grid),
            "constants": constants and {str(k).encode(): v for k, v in constants.items()}}
    args = (source.kernel_id.encode(), {_key(k): input_bytes(v) for k, v in buffers.items()},
            {terms.atom(k): v for k, v in opts.items() if v is not None})
    call = read_run(0, terms.to_term(args), runner.config, None, None).call  # the port's own checks
    runner.executor.named.check_constants(source, call.constants)
    admitted = runner.guard.admit_for_session(source, call.entry_point, call.constants, gas=True)
    got = runner.executor.named.run(admitted, call)
    return {name: _shaped(data, _spec(name, buffers, outputs)) for name, data in got.items()}


def _key(key: str | int) -> bytes | int:
    return key if isinstance(key, int) else key.encode()


def _size(spec: Output) -> int:
    if isinstance(spec, int):
        return spec
    shape, dtype = spec
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _spec(name: str, buffers: Mapping, outputs: Mapping) -> Any:
    """What shapes a returned buffer: its outputs entry, else its input array (in/out)."""
    for where in (outputs, buffers):
        if name in where:
            return where[name]
    return None


def _shaped(data: bytes, spec: Any) -> np.ndarray:
    if isinstance(spec, np.ndarray):
        return from_gpu(data, spec.dtype).reshape(spec.shape).copy()
    if isinstance(spec, tuple):
        shape, dtype = spec
        return from_gpu(data, dtype).reshape(shape).copy()
    if spec is not None and not isinstance(spec, (int, bytes, bytearray, memoryview)):
        raise bad_args(f"cannot shape a returned buffer by {type(spec).__name__}")
    return np.frombuffer(data, np.uint8).copy()
