"""kem from Python: one API for what the Erlang API does (docs/python.md).

::

    import numpy as np
    from kem_port import api

    words = np.arange(1000, dtype=np.uint32)
    doubled = api.run("double", words)          # numpy in, numpy out
    assert (doubled == words * 2).all()

- :func:`run` runs a kernel once in this process (``kem:execute/3``): numpy
  in, numpy out, shapes kept; :func:`run_named` any kernel by named buffers
  (``kem:run/3``); :func:`run_debug` with the debug channel's records.
- :class:`Session` keeps named buffers on a port's GPU (``kem:session_*``)
  and runs calls and chains on them; :class:`Port` is a local port process
  (``Port.chain`` for a chain without a session).
- :func:`health` and :func:`adapters` say which adapter kem runs on, and why.
- Every failure is :class:`KemError` with ``.reason`` and ``.detail``, the
  port's own reasons (a chain step's also ``.step``).

A :class:`Runner` owns one executor (device, compiled pipelines, buffer
pool); the functions share one made on first use; make your own to pick
settings. Nothing GPU-side lives in a module global.
"""

from __future__ import annotations

from kem_port.api.adapter_list import adapters
from kem_port.api.calls import DebugRun, default_runner, health, run, run_debug, run_named
from kem_port.api.gpu import GpuLayer, gpu_layer
from kem_port.api.runner import Runner, Timings
from kem_port.api.session import Port, Session, local_port
from kem_port.api.values import Input, Params
from kem_port.config import Config
from kem_port.errors import KemError

__all__ = [
    "Config", "DebugRun", "GpuLayer", "Input", "KemError", "Params", "Port", "Runner", "Session", "Timings",
    "adapters", "default_runner", "gpu_layer", "health", "local_port", "run", "run_debug", "run_named",
]
