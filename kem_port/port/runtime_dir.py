"""A private ``XDG_RUNTIME_DIR`` for the port, so Mesa has one.

Mesa's Vulkan drivers print ``error: XDG_RUNTIME_DIR is invalid or not set
in the environment`` when the variable is missing or names a directory that
is not ours with mode 0700 (the usual case under a service manager or in a
container). The port gives itself one before any driver is loaded: the
inherited one when it is valid, else ``kem-runtime-<uid>`` under the
temporary directory, created 0700 and reused by every port of this user.
"""

from __future__ import annotations

import os
import stat
import tempfile


def usable(path: str | None) -> bool:
    """What Mesa checks: a directory owned by us with mode 0700."""
    if not path:
        return False
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


def ensure(env: dict[str, str] | None = None) -> str:
    """Set ``XDG_RUNTIME_DIR`` (in ``env``, default os.environ) to a usable
    directory and return it."""
    target = os.environ if env is None else env
    current = target.get("XDG_RUNTIME_DIR")
    if usable(current):
        return current  # type: ignore[return-value]
    private = os.path.join(tempfile.gettempdir(), f"kem-runtime-{os.getuid()}")
    try:
        os.mkdir(private, 0o700)
    except FileExistsError:
        pass
    if not usable(private):  # someone else's, or loosened: make a fresh one
        private = tempfile.mkdtemp(prefix="kem-runtime-")
    target["XDG_RUNTIME_DIR"] = private
    return private
