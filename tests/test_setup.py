"""scripts/setup talks and skips what is done: on a set-up checkout a
second run installs nothing (no apt, no pip) and says so."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def setup() -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "setup")], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(shutil.which("dpkg-query") is None or shutil.which("rebar3") is None, reason="needs Debian and rebar3")
def test_setup_twice_skips_installed_work():
    first = setup()
    assert first.returncode == 0, first.stderr
    again = setup()
    assert again.returncode == 0, again.stderr
    lines = again.stderr.splitlines()
    assert "setup: system packages: already installed" in lines
    assert "setup: python package: up to date (pyproject.toml unchanged)" in lines
    assert not [line for line in lines if "installing" in line or "creating" in line], lines
    assert lines[-1].startswith("setup: done in ")
