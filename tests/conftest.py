"""Fixtures: a real port over real pipes, on whatever adapter wgpu finds
(Mesa's lavapipe on CI; KEM_ADAPTER picks another, e.g. on a GPU machine)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The tools (tools/fuzz.py, ...) are scripts, not part of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from kem_port.client import PortClient  # noqa: E402


@pytest.fixture(scope="session")
def port():
    with PortClient({"KEM_TEST_HOOKS": "1"}) as client:
        yield client


@pytest.fixture
def rng():
    # Fresh inputs every run; the seed is printed on failure by pytest's repr.
    return np.random.default_rng()


@pytest.fixture
def kernel_dir(tmp_path):
    """A KEM_KERNEL_DIR of the test's own kernels."""
    return tmp_path


def start_port(**env: str) -> PortClient:
    return PortClient({"KEM_TEST_HOOKS": "1", **env})
