"""A private ``XDG_RUNTIME_DIR`` for the port, so Mesa has one.

Mesa's Vulkan drivers print ``error: XDG_RUNTIME_DIR is invalid or not set
in the environment`` when the variable is missing or names a directory that
is not ours with mode 0700 (the usual case under a service manager or in a
container). The port gives itself one before any driver is loaded: the
inherited one when it is valid, else ``kem-runtime-<uid>`` under the
temporary directory, created 0700 and reused by every port of this user.

That shared name is checked without following a link: the temporary
directory is everyone's, so another user can plant ``kem-runtime-<uid>``
first, as a symlink to a directory of ours with mode 0700 (``~/.ssh``)
that passes the owner and mode checks, and re-point it later at a
directory of theirs. The warm process's socket lives here (docs/cli.md),
so a client would then hand a stranger's process its argv and its three
standard streams. A real directory that we own cannot be swapped by
another user in a sticky /tmp.
"""

from __future__ import annotations

import os
import stat
import tempfile


def usable(path: str | None, follow: bool = True) -> bool:
    """What Mesa checks: a directory owned by us with mode 0700 (``follow``
    False: the path itself, not a link's target)."""
    if not path:
        return False
    try:
        info = os.stat(path) if follow else os.lstat(path)
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
    if not usable(private, follow=False):  # someone else's, a link, or loosened: make a fresh one
        private = tempfile.mkdtemp(prefix="kem-runtime-")
    target["XDG_RUNTIME_DIR"] = private
    return private
