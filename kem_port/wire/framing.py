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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kem_port.transfer.fd_io import read_into, write_all
from kem_port.wire.batch_frames import replies_frame
from kem_port.wire.terms import ok_binary_frame, ok_binary_reply

HEADER = struct.Struct(">I")
_DISCARD_CHUNK = 1 << 20


# Of an oversized frame: enough to read the ReqId it names, or the 256
# entries of a group frame after a 128-byte kernel id (group_frames.py).
HEAD_KEPT = 4096


class OversizedFrame(Exception):
    def __init__(self, size: int, limit: int, head: bytes = b"") -> None:
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")
        self.size = size
        self.limit = limit
        self.head = head  # its first bytes, so its caller can be answered


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
    if len(first) + read_into(fd, view[len(first) :]) < n:
        return None
    # erlang-py decodes only `bytes`: this copy is the price (measured in
    # docs/codec.md, well under the pipe's own cost).
    return bytes(buf)


def read_frame(fd: int, max_size: int) -> bytes | None:
    """Return the next frame's payload, or None at EOF.

    Raises OversizedFrame (after skipping the payload) when the declared
    length exceeds max_size.
    """
    # The usual case in place (a whole header, then a whole body, each in
    # one read): two Python calls fewer a frame than through _read_exact,
    # each ~1 us where a lone call's caches are cold (docs/benchmarks.md).
    header = os.read(fd, 4)
    if len(header) < 4:
        header = _finish(fd, header, 4)
        if header is None:
            return None
    (size,) = HEADER.unpack(header)
    if size > max_size:
        head = _read_exact(fd, min(size, HEAD_KEPT)) or b""
        _discard(fd, size - len(head))
        raise OversizedFrame(size, max_size, head)
    if size == 0:
        return b""
    body = os.read(fd, size)
    return body if len(body) == size else _finish(fd, body, size)


def _finish(fd: int, first: bytes, n: int) -> bytes | None:
    """The rest of n bytes whose first read gave `first`; None on EOF."""
    if not first:
        return None
    rest = _read_exact(fd, n - len(first))
    return None if rest is None else first + rest


def _discard(fd: int, size: int) -> None:
    left = size
    while left:
        chunk = os.read(fd, min(left, _DISCARD_CHUNK))
        if not chunk:
            return
        left -= len(chunk)


_IOV_MAX = 512  # buffers per writev, well under Linux's 1024
# Results in one replies frame (batch_frames.py): Erlang keeps a sub-binary
# of the frame per result, so a result held for long keeps at most this
# much of the frame alive; 64 small results are ~1 KiB.
REPLIES_BYTES = 1 << 20
REPLIES_CALLS = 256
ONE_BUFFER_REPLY = 64 * 1024  # a reply written alone is copied into one buffer up to this size


class FrameWriter:
    """Writes whole frames atomically with respect to other threads.

    Inside ``gathered()`` a thread's frames are held and go out together in
    one ``writev`` when the block ends: a batch's small replies cost one
    system call instead of one each (~9 us a reply to a pipe here). Only
    frames made of ``bytes`` are held; a frame that points into memory the
    caller will reuse (a mapped GPU buffer) is written at once, after
    whatever was held, so order is kept. Binary results held there
    (:meth:`write_result`) go out as one replies frame (batch_frames.py),
    which Erlang splits with sub-binaries: one port message for the batch.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._local = threading.local()
        # Replies frames go only to a peer that has sent a calls frame (the
        # node's kem_port.erl): a peer that sends one call a frame, such as
        # a hand-made client, keeps reading one reply a frame.
        self._replies_frames = False

    def batch_replies(self) -> None:
        """The peer sends calls or group frames, so it reads replies frames too."""
        self._replies_frames = True

    def write(self, parts: Sequence[bytes | memoryview]) -> None:
        total = sum(len(p) for p in parts)
        views = [memoryview(HEADER.pack(total))] + [memoryview(p).cast("B") for p in parts]
        held: list[memoryview] | None = getattr(self._local, "held", None)
        if held is not None and all(type(v.obj) is bytes for v in views):
            held.extend(views)
            return
        if held:
            views = held + views
            held.clear()
        self._write(views)

    def write_result(self, req_id: int, payload: bytes | memoryview) -> None:
        """``{reply, ReqId, {ok, Payload}}``, or a place in the replies frame
        of the gathered block around it when the payload is held bytes."""
        results: list | None = getattr(self._local, "results", None)
        if results is None and len(payload) <= ONE_BUFFER_REPLY:
            # A reply alone (a lone call's): one buffer, one write. Through
            # write() it took 4.5 us (views, casts, sums); this 2.0 (timeit).
            self.write_one(ok_binary_frame(req_id, payload))
            return
        if results is not None and self._replies_frames and type(memoryview(payload).obj) is bytes:
            results.append((req_id, payload))
            return
        self.write(ok_binary_reply(req_id, payload))

    @contextmanager
    def gathered(self) -> Iterator[None]:
        self._local.held = held = []
        self._local.results = results = []
        try:
            yield
        finally:
            self._local.held = None
            self._local.results = None
            for parts in _result_frames(results):
                held.append(memoryview(HEADER.pack(sum(len(p) for p in parts))))
                held.extend(memoryview(p).cast("B") for p in parts)
            if held:
                self._write(held)

    def write_one(self, data: bytes) -> None:
        """One framed buffer, one os.write (a lone reply): no list of views for
        writev to walk; a short write (a full pipe) finishes through
        write_all."""
        with self._lock:
            try:
                written = os.write(self._fd, data)
                if written < len(data):
                    write_all(self._fd, [memoryview(data)[written:]])
            except (BrokenPipeError, ConnectionResetError):
                os._exit(0)  # as _write: nobody is left to answer

    def _write(self, views: list) -> None:
        with self._lock:
            try:
                for start in range(0, len(views), _IOV_MAX):
                    write_all(self._fd, views[start : start + _IOV_MAX])
            except (BrokenPipeError, ConnectionResetError):
                # The node closed our output: nobody is left to answer.
                os._exit(0)


def _result_frames(results: list[tuple[int, bytes | memoryview]]) -> Iterator[Sequence[bytes | memoryview]]:
    """A lone result as its own reply frame (the node's lone-call path is
    unchanged); more as replies frames of at most REPLIES_BYTES each."""
    if len(results) == 1:
        yield ok_binary_reply(*results[0])
        return
    chunk: list[tuple[int, bytes | memoryview]] = []
    size = 0
    for req_id, payload in results:
        if chunk and (size + len(payload) > REPLIES_BYTES or len(chunk) == REPLIES_CALLS):
            yield replies_frame(chunk)
            chunk, size = [], 0
        chunk.append((req_id, payload))
        size += len(payload)
    if len(chunk) == 1:
        yield ok_binary_reply(*chunk[0])
    elif chunk:
        yield replies_frame(chunk)
