"""Is this port able to run kernels, on what, and if not, why?

``ping`` says only that the port process answers; ``health`` says whether
its adapter is usable, which one, CPU or GPU, and the reason when there is
none or when the port fell back to a CPU implementation (Mesa's lavapipe):
a CPU adapter runs every kernel, far slower, so it is a warning, not a
silent choice. kem_health.erl gathers this from every port.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from kem_port.config import Config
from kem_port.gpu.executor import Executor

log = logging.getLogger("kem_port.health")


def kind_of(info: dict) -> str:
    """``cpu`` for a CPU implementation, ``gpu`` for any other adapter type."""
    return "cpu" if str(info.get("adapter_type", "")).upper() == "CPU" else "gpu"


# Who set KEM_ADAPTER, when the Erlang app did (kem_adapters:port_env/1):
# `discovery' (its own pick: the GPUs, else the one CPU adapter) or
# `adapters' (the operator's `adapters' list). Not a setting: an operator
# sets KEM_ADAPTER (or the app env `adapter') and this stays unset.
PINNED_BY_ENV = "KEM_ADAPTER_PINNED_BY"
SLOWER = "kernels run on the CPU, far slower than on a GPU"


def fallback_reason(info: dict, config: Config, pinned_by: str | None = None) -> str | None:
    """Why the port runs on a CPU adapter; None on a GPU. It names only a
    choice someone made: the node's discovery, the node's ``adapters``
    setting, KEM_ADAPTER, or wgpu's own pick."""
    if kind_of(info) != "cpu":
        return None
    name = info.get("name") or "a CPU adapter"
    if pinned_by == "discovery":
        why = "discovery found no Vulkan GPU, or `exclude` left none"
        return f"the node's only adapter is a CPU implementation, {name} ({why}): {SLOWER}"
    if pinned_by == "adapters":
        return f"the node's `adapters` setting chose adapter {config.adapter}, {name}, a CPU implementation: {SLOWER}"
    if config.adapter:
        return f"KEM_ADAPTER={config.adapter!r} chose {name}, a CPU implementation: {SLOWER}"
    return f"wgpu found no GPU adapter; {name} runs kernels on the CPU, far slower"


def pinned_by(env: Mapping[str, str] = os.environ) -> str | None:
    """The Erlang app's word on who chose KEM_ADAPTER (PINNED_BY_ENV)."""
    return env.get(PINNED_BY_ENV) or None


class Health:
    def __init__(self, executor: Executor, config: Config, open_error: BaseException | None = None) -> None:
        """How opening the device went (`open_error`: why it failed), said at the right level."""
        self.executor = executor
        self.config = config
        self.open_error: str | None = None
        self.pinned_by = pinned_by()
        if open_error is not None:
            self.open_error = " ".join(str(open_error).split())  # wgpu's are multi-line
            log.error("no usable adapter: %s", self.open_error)
            return
        reason = fallback_reason(self.executor.info, self.config, self.pinned_by)
        # A chosen adapter is no fall-back; in a node the app warns once per
        # port group (kem_port_start), not once per port start here.
        if reason is not None and not self.config.adapter:
            log.warning("falling back to a CPU adapter: %s", reason)

    def describe(self) -> dict[str, Any]:
        info = self.executor.info
        usable = bool(info) and self.executor.gpu.device is not None
        if not usable:
            reason = self.open_error or "the GPU device is not open"
            return {"usable": False, "adapter": None, "kind": "none", "backend": None, "reason": reason}
        return {
            "usable": True,
            "adapter": info.get("name", ""),
            "kind": kind_of(info),
            "backend": info.get("backend", ""),
            "reason": fallback_reason(info, self.config, self.pinned_by),
        }
