"""``{packet,4}`` framing: a 4-byte big-endian length, then that many bytes.

Reading checks the declared length against a cap *before* allocating; an
oversized frame is read and discarded in small chunks so the stream stays in
sync, and reported as :class:`OversizedFrame`. Writing takes a list of
buffers and hands them to ``os.writev`` so a large result goes from the GPU's
mapped memory to the pipe without an intermediate copy.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence

HEADER = struct.Struct(">I")
_DISCARD_CHUNK = 1 << 20


class OversizedFrame(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")
        self.size = size
        self.limit = limit


def _read_exact(fd: int, n: int) -> bytes | None:
    """Read exactly n bytes; None on EOF (a partial frame at EOF is EOF too)."""
    if n == 0:
        return b""
    first = os.read(fd, n)
    if not first:
        return None
    if len(first) == n:
        return first
    buf = bytearray(n)
    view = memoryview(buf)
    view[: len(first)] = first
    got = len(first)
    with open(fd, "rb", buffering=0, closefd=False) as raw:
        while got < n:
            k = raw.readinto(view[got:])
            if not k:
                return None
            got += k
    # erlang-py decodes only `bytes`: this copy is the price (measured in
    # docs/codec.md, well under the pipe's own cost).
    return bytes(buf)


def read_frame(fd: int, max_size: int) -> bytes | None:
    """Return the next frame's payload, or None at EOF.

    Raises OversizedFrame (after skipping the payload) when the declared
    length exceeds max_size.
    """
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > max_size:
        _discard(fd, size)
        raise OversizedFrame(size, max_size)
    return _read_exact(fd, size)


def _discard(fd: int, size: int) -> None:
    left = size
    while left:
        chunk = os.read(fd, min(left, _DISCARD_CHUNK))
        if not chunk:
            return
        left -= len(chunk)


class FrameWriter:
    """Writes whole frames atomically with respect to other threads."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def write(self, parts: Sequence[bytes | memoryview]) -> None:
        total = sum(len(p) for p in parts)
        views = [memoryview(HEADER.pack(total))] + [memoryview(p).cast("B") for p in parts]
        with self._lock:
            try:
                write_all(self._fd, views)
            except (BrokenPipeError, ConnectionResetError):
                # The node closed our output: nobody is left to answer.
                os._exit(0)


def write_all(fd: int, views: list[memoryview]) -> None:
    """Write every byte of views, resuming after partial writes."""
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
