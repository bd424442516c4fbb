"""Sessions and chains on one port's GPU, and what a failure in them means.

Everything here runs on the GPU thread (the router hands it over as a
control action), so it never overlaps a batch. A wgpu failure becomes a
KemError: device loss rebuilds the device (every session on it is then
lost: gpu/sessions.py), anything else is ``gpu_error``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import wgpu

from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.session.chain import ChainRunner
from kem_port.gpu.executor import Executor, is_device_lost
from kem_port.gpu.pipelines import gpu_message
from kem_port.gpu.session.sessions import Sessions
from kem_port.stats import Stats

log = logging.getLogger("kem_port.gpu.session_service")
T = TypeVar("T")


class SessionService:
    def __init__(self, executor: Executor, config: Config, stats: Stats) -> None:
        self.executor = executor
        self.sessions = Sessions(executor.gpu, config.session_quota_bytes, config.port_session_quota_bytes)
        # A chain's temporaries are bounded like one session's buffers, and
        # its new buffers and work like one call's output (gpu/chain_budget.py),
        # its gas like one call's (gpu/session/chain_gas.py).
        self.chains = ChainRunner(executor.gpu, stats, config.session_quota_bytes, config.max_output_bytes, config.gas_limit)

    def describe(self) -> dict[str, int]:
        return {**self.sessions.describe(), "chain_kits": len(self.chains.kits)}

    def run(self, work: Callable[[], T]) -> T:
        """Run `work` against an open device; failures come out as KemError."""
        if self.executor.gpu.device is None:
            try:
                self.executor.open()
            except KemError:
                raise
            except Exception as exc:
                raise KemError("no_adapter", str(exc)) from None
        try:
            return work()
        except KemError:
            raise
        except Exception as exc:
            if is_device_lost(exc):
                log.error("device lost in a session: %s; rebuilding", exc)
                self._rebuild()
                raise KemError("device_lost", f"the GPU device was lost: {gpu_message(exc)}") from None
            if isinstance(exc, (wgpu.GPUError, RuntimeError, ValueError)):
                raise KemError("gpu_error", gpu_message(exc)) from None
            raise

    def _rebuild(self) -> None:
        try:
            self.executor.rebuild()
        except Exception as exc:
            log.error("rebuild failed: %s", exc)
            self.executor.gpu.close()
