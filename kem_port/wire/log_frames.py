"""The port's log records, as frames to the node's OTP ``logger``.

Every record at or above ``KEM_LOG`` becomes one frame on the protocol
stream, ``{log, Level, Logger, Msg, Meta}`` (docs/protocol.md), which the
port owner hands to ``logger`` with its own metadata added (kem_log.erl).
There is one log pipeline, the node's: nothing the port logs goes to a
console of its own. ``Meta`` carries what the port knows (its index, OS
pid, adapter) plus a record's ``kernel_id`` when the caller gave one
(``log.warning(..., extra={"kernel_id": id})``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from kem_port.wire import terms
from kem_port.errors import KemError
from kem_port.wire.framing import FrameWriter

log = logging.getLogger("kem_port.router")

def erlang_level(levelno: int) -> str:
    if levelno >= logging.CRITICAL:
        return "critical"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= logging.INFO:
        return "info"
    return "debug"


def log_frame(level: str, logger: str, message: str, meta: dict[str, Any]) -> bytes:
    """``{log, Level, Logger, Msg, Meta}``: atoms for Level and Meta's keys,
    binaries for text."""
    return terms.encode(
        (terms.atom("log"), terms.atom(level), terms.to_term(logger), terms.to_term(message), terms.to_term(meta))
    )


class FrameLogHandler(logging.Handler):
    """A logging handler that writes each record as a log frame.

    ``context`` is shared and updated by the server (the adapter becomes
    known after the device opens). A record that cannot be written is
    reported on ``fallback_fd`` (the port's original stderr), never on the
    captured stderr, which would loop back into this handler.
    """

    def __init__(self, writer: FrameWriter, context: dict[str, Any], fallback_fd: int | None = None) -> None:
        super().__init__()
        self.writer = writer
        self.context = context
        self.fallback_fd = fallback_fd
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            meta = dict(self.context)
            kernel_id = getattr(record, "kernel_id", None)
            if kernel_id is not None:
                meta["kernel_id"] = str(kernel_id)
            frame = log_frame(erlang_level(record.levelno), record.name, self.format(record), meta)
            self.writer.write([frame])
        except Exception:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        if self.fallback_fd is None:
            return
        try:
            os.write(self.fallback_fd, f"kem_port: could not send a log record: {record.getMessage()}\n".encode())
        except OSError:
            pass


def install(writer: FrameWriter, level: str, context: dict[str, Any], fallback_fd: int | None) -> FrameLogHandler:
    """Route every record of this process, at ``level`` and up, to frames."""
    handler = FrameLogHandler(writer, context, fallback_fd)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def kernel_failed(kernel_id: str, error: KemError) -> None:
    """A kernel call failed: INFO, since a kernel author's mistake is theirs
    to see (``KEM_LOG=info``), not the operator's; tagged with the kernel."""
    log.info("kernel %s failed: %s: %s", kernel_id, error.reason, error.detail, extra={"kernel_id": kernel_id})
