"""Sessions: named GPU buffers that stay resident across calls.

A session belongs to one port (one device). Its buffers come from the
device's buffer pool (kind ``session``) and go back to it when they are
freed or the session closes, so an owner that dies returns its memory at
once. Every size is checked against the session's and the port's quota
before anything is allocated (docs/sessions.md).

A session is lost, never silently fresh, when the device it was created on
is replaced (device loss rebuilds it) or the port restarted: the port's
``incarnation`` is part of every session reference, and a port that does
not know the pair answers ``session_lost``.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
from dataclasses import dataclass, field

import wgpu

from kem_port.errors import KemError, bad_args
from kem_port.gpu.device import Device
from kem_port.gpu.hot_path import HotPath

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")  # a WGSL identifier; \Z: "$" took "c2\n" (red team)
KIND = "session"
MAX_SESSIONS = 4096  # per port
MAX_BUFFERS = 1024  # per session


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise bad_args(f"{name[:80]!r} is not a buffer name: use a WGSL identifier (letters, digits, '_')")
    return name


def check_word_multiple(value: int, what: str) -> None:
    # WebGPU copies, writes and storage bindings all work in whole 4-byte words.
    if value % 4:
        raise bad_args(f"{what} {value} is not a multiple of 4")


def quota_exceeded(detail: str) -> KemError:
    return KemError("quota_exceeded", detail)


def session_lost(detail: str) -> KemError:
    return KemError("session_lost", detail)


@dataclass
class SessionBuffer:
    name: str
    size: int
    buffer: wgpu.GPUBuffer


@dataclass
class Session:
    id: int
    quota: int
    device: wgpu.GPUDevice
    buffers: dict[str, SessionBuffer] = field(default_factory=dict)
    # Counts creates and frees: a chain's kit (gpu/session/chain_kit.py) runs
    # only on the buffers it was planned with (a new name can change a binding).
    generation: int = 0

    @property
    def bytes(self) -> int:
        return sum(b.size for b in self.buffers.values())

    def buffer(self, name: str) -> SessionBuffer:
        found = self.buffers.get(name)
        if found is None:
            raise KemError("no_buffer", f"session has no buffer {name!r}")
        return found


class Sessions:
    """Every open session of one port. Buffer work runs on the GPU thread;
    the lock only guards the tables (stats read them from the reader)."""

    def __init__(self, gpu: Device, session_quota: int, port_quota: int) -> None:
        self.gpu = gpu
        self.session_quota = session_quota
        self.port_quota = port_quota
        self.incarnation = secrets.randbits(48)
        self._sessions: dict[int, Session] = {}
        self._next_id = 1
        self._lock = threading.Lock()

    # -- sessions -----------------------------------------------------------

    def open(self, quota: int | None) -> int:
        if quota is not None and quota > self.session_quota:
            raise quota_exceeded(f"a session quota of {quota} bytes is over KEM_SESSION_QUOTA_BYTES={self.session_quota}")
        device = self.gpu.require()
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                raise quota_exceeded(f"this port already holds {MAX_SESSIONS} sessions")
            session_id, self._next_id = self._next_id, self._next_id + 1
            self._sessions[session_id] = Session(session_id, quota if quota is not None else self.session_quota, device)
        return session_id

    def get(self, incarnation: int, session_id: int) -> Session:
        if incarnation != self.incarnation:
            raise session_lost("the port that held this session has restarted")
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise session_lost("this port holds no such session (closed, or its owner exited)")
        if session.device is not self.gpu.device:
            self._drop(session)
            raise session_lost("the GPU device that held this session was lost")
        return session

    def bytes_of(self, session_id: int) -> int:
        """A session's bytes as the tables hold them now (0 if unknown)."""
        with self._lock:
            session = self._sessions.get(session_id)
            return session.bytes if session is not None else 0

    def close(self, incarnation: int, session_id: int) -> None:
        session = self.get(incarnation, session_id)
        self._drop(session)

    def _drop(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.id, None)
        pool = self.gpu.pool
        for buf in session.buffers.values():
            if pool is not None and session.device is self.gpu.device:
                pool.give(KIND, buf.buffer)
            else:  # the device is gone; so is what it held
                with contextlib.suppress(Exception):  # a lost device may refuse even this
                    buf.buffer.destroy()
        with self._lock:
            session.buffers.clear()
            session.generation += 1

    def describe(self) -> dict[str, int]:
        with self._lock:
            sessions = list(self._sessions.values())
            held = sum(s.bytes for s in sessions)
        return {"sessions": len(sessions), "session_bytes": held}

    # -- buffers --------------------------------------------------------------

    def create(self, session: Session, name: str, size: int, data: bytes | memoryview | None) -> None:
        check_name(name)
        check_word_multiple(size, "buffer size")
        if size <= 0:
            raise bad_args("a buffer needs at least 4 bytes")
        if name in session.buffers:
            raise KemError("buffer_exists", f"session already has a buffer {name!r}; free it first")
        if len(session.buffers) >= MAX_BUFFERS:
            raise quota_exceeded(f"a session holds at most {MAX_BUFFERS} buffers")
        self.reserve(session, size)
        buf = self.take(size)
        queue = session.device.queue
        if data is not None:
            queue.write_buffer(buf, 0, data)
        else:
            encoder = session.device.create_command_encoder()
            encoder.clear_buffer(buf, 0, size)  # pooled buffers hold earlier bytes
            queue.submit([encoder.finish()])
        with self._lock:
            session.buffers[name] = SessionBuffer(name, size, buf)
            session.generation += 1

    def reserve(self, session: Session, size: int) -> None:
        """Refuse `size` more bytes over the binding limit or either quota."""
        if size > self.gpu.binding_limit:
            raise KemError("too_large", f"{size} bytes is over this adapter's storage binding limit of {self.gpu.binding_limit}")
        if session.bytes + size > session.quota:
            raise quota_exceeded(f"{size} more bytes would put this session at {session.bytes + size}, over its quota of {session.quota}")
        total = self.describe()["session_bytes"]
        if total + size > self.port_quota:
            raise quota_exceeded(f"{size} more bytes would put this port's sessions at {total + size}, over KEM_PORT_SESSION_QUOTA_BYTES={self.port_quota}")

    def take(self, size: int) -> wgpu.GPUBuffer:
        pool = self.gpu.pool
        assert pool is not None
        return pool.take(KIND, size)

    def give(self, buf: wgpu.GPUBuffer) -> None:
        if self.gpu.pool is not None:
            self.gpu.pool.give(KIND, buf)

    def write(self, session: Session, name: str, offset: int, data: bytes | memoryview) -> None:
        buf = session.buffer(name)
        self._check_range(buf, offset, len(data))
        if data:
            session.device.queue.write_buffer(buf.buffer, offset, data)

    def read(self, session: Session, name: str, offset: int, length: int | None) -> bytes:
        buf = session.buffer(name)
        length = buf.size - offset if length is None else length
        self._check_range(buf, offset, length)
        if length == 0:
            return b""
        return read_back(self.gpu, [(buf.buffer, offset, length)])[0]

    def free(self, session: Session, name: str) -> None:
        buf = session.buffer(name)
        with self._lock:
            del session.buffers[name]
            session.generation += 1
        self.give(buf.buffer)

    @staticmethod
    def _check_range(buf: SessionBuffer, offset: int, length: int) -> None:
        check_word_multiple(offset, "offset")
        check_word_multiple(length, "length")
        if offset < 0 or length < 0 or offset + length > buf.size:
            raise bad_args(f"range {offset}..{offset + length} is outside buffer {buf.name!r} of {buf.size} bytes")


def read_back(gpu: Device, ranges: list[tuple[wgpu.GPUBuffer, int, int]]) -> list[bytes]:
    """Copy (buffer, offset, length) ranges into one staging buffer and read them."""
    path = gpu.hot
    return finish_and_read(path, gpu, path.encoder(), ranges, gpu.spin_s)


def finish_and_read(path: HotPath, gpu: Device, encoder, ranges: list[tuple[wgpu.GPUBuffer, int, int]],
                    spin_s: float) -> list[bytes]:
    """Append copies of `ranges` to `encoder` (the hot path's: gpu/hot_path.py),
    submit it once, and read them back. Through the C API where wgpu-py has
    it, as the batches and kits are: wgpu-py's map_async hands the wait to
    its poller thread, whose polls took the device's locks from this thread's
    submit and map (py-spy on a resident step, lavapipe: 34% of the port's
    samples in finish_and_read, most in map_async and submit)."""
    pool = gpu.pool
    assert pool is not None
    offsets, total = [], 0
    for _, _, length in ranges:
        offsets.append(total)
        total += -(-length // 256) * 256
    total = max(total, 4)
    staging = pool.take("staging", total)
    try:
        try:
            for (buf, offset, length), at in zip(ranges, offsets):
                if length:
                    encoder.copy(buf, offset, staging, at, length)
            commands = encoder.finish()
        except BaseException:
            encoder.abandon()
            raise
        index = path.submit(commands)
        path.wait(path.map_read(staging, 0, total), spin_s, index)
        try:
            view = path.mapped(staging, 0, total)
            return [bytes(view[at : at + length]) for (_, _, length), at in zip(ranges, offsets)]
        finally:
            path.unmap(staging)
    finally:
        pool.give("staging", staging)
