"""Running the ``kem`` command as a user would: a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # A private runtime dir keeps Mesa's XDG_RUNTIME_DIR notice off stderr,
    # so the tests can hold the command to one line of error.
    runtime = tmp / "xdg"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    env.update(extra)
    return env


def kem(tmp: Path, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kem_port.cli", *args],
        input=stdin, capture_output=True, env=env or cli_env(tmp), timeout=timeout,
    )
