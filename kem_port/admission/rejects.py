"""Kernels refused for what their bytes did to the compiler, remembered on disk.

A kernel that crashed the compile worker or exceeded a limit would do it
again: its sha256 is written to ``<cache dir>/rejected/<sha256>`` with the
reason, and every later call is refused at once, across port restarts.
The directory is as untrusted as any file: names must be 64 hex digits,
contents are read up to MAX_REASON bytes and used only as text for the
caller, and a missing or unwritable directory degrades to memory only.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

log = logging.getLogger("kem_port.admission.rejects")

MAX_REASON = 512
SHA256 = re.compile(r"[0-9a-f]{64}")


class RejectStore:
    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._memory: dict[str, str] = {}
        self._lock = threading.Lock()

    def lookup(self, sha256: str) -> str | None:
        """The reason this kernel was refused, or None."""
        if not SHA256.fullmatch(sha256):
            return None
        with self._lock:
            found = self._memory.get(sha256)
        if found is not None or self.directory is None:
            return found
        try:
            fd = os.open(self.directory / sha256, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not _regular(fd):
                return None
            reason = os.read(fd, MAX_REASON).decode("utf-8", "replace").strip() or "refused"
        finally:
            os.close(fd)
        with self._lock:
            self._memory[sha256] = reason
        return reason

    def remember(self, sha256: str, reason: str) -> None:
        if not SHA256.fullmatch(sha256):
            return
        reason = reason[:MAX_REASON]
        with self._lock:
            self._memory[sha256] = reason
        if self.directory is None:
            return
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.directory / f".{sha256}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, reason.encode("utf-8", "replace")[:MAX_REASON])
            finally:
                os.close(fd)
            os.replace(tmp, self.directory / sha256)
        except OSError as exc:  # memory still holds it for this port's life
            log.warning("cannot record a refused kernel on disk: %s", exc)


def _regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)
