"""Placeholder remote store until the gateway path lands: refuses every id."""

from __future__ import annotations

from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats


class ArweaveStore:
    def __init__(self, config: Config, stats: Stats) -> None:
        self.config = config
        self.stats = stats

    def accepts(self, kernel_id: str) -> bool:
        return False

    def cached(self, kernel_id: str) -> KernelSource | None:
        return None

    def fetch(self, kernel_id: str) -> KernelSource:
        raise KemError("kernel_not_found", kernel_id)

    def describe(self) -> dict:
        return {}

    def describe_stats(self) -> dict:
        return {}
