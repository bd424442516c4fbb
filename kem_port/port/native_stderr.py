"""Native libraries' stderr, captured and logged instead of sprayed.

Vulkan loaders and drivers write diagnostics straight to descriptor 2. At
start-up (before wgpu is imported) descriptor 2 is pointed at a pipe; a
thread reads it line by line and logs each line on the ``kem_port.native``
logger, so it reaches the node through the one log pipeline
(log_frames.py) with the port's metadata. Python's own ``sys.stderr``
(tracebacks of stray threads) takes the same road. The original stderr is
kept for the one thing that cannot travel as a frame: a failure to send
frames at all.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

log = logging.getLogger("kem_port.native")
MAX_LINE = 4096  # longer lines are cut: one driver line must not flood the node


@dataclass(frozen=True)
class CapturedStderr:
    read_fd: int  # the pipe's end the forwarding thread reads
    original_fd: int  # the port's stderr as it was started


def capture() -> CapturedStderr:
    """Point descriptor 2 at a pipe; return its read end and the old stderr."""
    original = os.dup(2)
    os.set_inheritable(original, False)
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, False)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    os.dup2(2, 1)  # stray writes to stdout (claimed by stdio_guard) take the same road
    return CapturedStderr(read_fd, original)


def forward(captured: CapturedStderr) -> threading.Thread:
    """Start the thread that turns captured lines into log records."""
    thread = threading.Thread(target=_pump, args=(captured.read_fd,), name="kem-stderr", daemon=True)
    thread.start()
    return thread


def _pump(fd: int) -> None:
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _emit(line)
        if len(pending) > MAX_LINE:
            _emit(pending)
            pending = b""


def _emit(raw: bytes) -> None:
    text = raw[:MAX_LINE].decode("utf-8", "replace").rstrip()
    if text:
        log.log(level_of(text), "%s", text)


def level_of(line: str) -> int:
    """Drivers tag their own lines; untagged ones are kept at INFO, below the
    default WARNING, since Mesa and the Vulkan loader chat at every start."""
    head = line.lstrip()[:16].lower()
    if head.startswith(("error", "fatal", "panic", "traceback")):
        return logging.ERROR
    if head.startswith(("warning", "warn")):
        return logging.WARNING
    return logging.INFO
