"""Session and chain methods read into typed requests (wire/requests.py
calls this for every method in SESSION_METHODS): their arguments checked
once, here, in the order the methods check them (session_protocol.py
holds the checks); nothing after reads their terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kem_port.config import Config
from kem_port.errors import bad_args
from kem_port.wire import session_protocol as sp
from kem_port.wire.terms import atom_name


@dataclass(frozen=True)
class BufferRequest:
    """session_open, session_close or a buffer method, read."""

    req_id: int
    method: str
    ref: tuple[int, int] | None = None  # the session (session_open: none yet)
    name: str | None = None
    quota: int | None = None  # session_open
    size: int | None = None  # buffer_create: its size
    data: bytes | None = None  # buffer_create's contents, buffer_write's bytes
    offset: int = 0
    length: int | None = None  # buffer_read: None reads to the end

    def bytes_moved(self) -> int:
        """How many bytes the method writes or reads (0: none; -1: a read to the end, size unknown here)."""
        if self.method == "buffer_create":
            return self.size or 0
        if self.method == "buffer_write":
            return len(self.data or b"")
        if self.method == "buffer_read":
            return -1 if self.length is None else self.length
        return 0


@dataclass(frozen=True)
class ChainRequest:
    """session_call (one step, a session's buffers) or chain, read."""

    req_id: int
    method: str
    ref: tuple[int, int] | None
    steps: list[sp.StepArgs]
    data: bytes
    returns: tuple[str, ...] | None
    metering: sp.Metering = sp.Metering()  # gas_limit and usage (docs/metering.md)


def read_session(req_id: int, method: str, args: tuple, config: Config) -> BufferRequest | ChainRequest:
    """The typed request of a session or chain method; KemError (StepError
    for a chain step's) when its arguments are not well formed."""
    if method == "session_call":
        sp.arity(args, 4, "{Session, KernelId, Input, Opts}")
        ref = sp.session_ref(args[0])
        data = sp.binary(args[2], "Input", config)
        step, metering = sp.call_step(args[1], data, args[3], config)
        return ChainRequest(req_id, method, ref, [step], data, None, metering)
    if method == "chain":
        sp.arity(args, 3, "{Session | undefined, Steps, Opts}")
        chain_ref = None if atom_name(args[0]) == "undefined" else sp.session_ref(args[0])
        steps = sp.chain_steps(args[1], config)
        data, returns, metering = sp.chain_opts(args[2], config)
        return ChainRequest(req_id, method, chain_ref, steps, data, returns, metering)
    if method == "session_open":
        return BufferRequest(req_id, method, quota=sp.open_quota(args))
    return _buffer_request(req_id, method, args, config)


def _buffer_request(req_id: int, method: str, args: tuple, config: Config) -> BufferRequest:
    if not args:
        raise bad_args(f"{method} takes {{Session, ...}}")
    ref = sp.session_ref(args[0])
    if method in ("session_close", "buffer_list"):
        sp.arity(args, 1, "{Session}")
        return BufferRequest(req_id, method, ref)
    if method == "buffer_free":
        sp.arity(args, 2, "{Session, Name}")
        return BufferRequest(req_id, method, ref, sp.name(args[1]))
    if method == "buffer_create":
        sp.arity(args, 3, "{Session, Name, Size | Bytes}")
        name = sp.name(args[1])
        size, data = _contents(args[2], config)
        return BufferRequest(req_id, method, ref, name, size=size, data=data)
    if method == "buffer_write":
        sp.arity(args, 4, "{Session, Name, Offset, Bytes}")
        name, offset = sp.name(args[1]), sp.size(args[2], "offset", config)
        return BufferRequest(req_id, method, ref, name, data=sp.binary(args[3], "Bytes", config), offset=offset)
    sp.arity(args, 4, "{Session, Name, Offset, Length | undefined}")  # buffer_read
    name, offset = sp.name(args[1]), sp.size(args[2], "offset", config)
    length = None if atom_name(args[3]) == "undefined" else sp.size(args[3], "length", config)
    return BufferRequest(req_id, method, ref, name, offset=offset, length=length)


def _contents(value: Any, config: Config) -> tuple[int, bytes | None]:
    if type(value) is int:
        return sp.size(value, "buffer size", config, minimum=4), None
    data = sp.binary(value, "buffer contents", config)
    return len(data), data
