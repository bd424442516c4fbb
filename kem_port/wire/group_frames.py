"""Group frames (protocol 4; docs/protocol.md, "Group frames"): N calls to
one kernel with one input size and hint in one frame.

    {group, KernelId, Hint, Entries, Inputs}

``Entries`` holds ``<<ReqId:64, TimeoutMs:32>>`` per call (TimeoutMs 0: no
timeout), ``Inputs`` the N inputs of S bytes each, back to back. The frame
means exactly the N calls ``{call, ReqId_i, execute_kernel, {KernelId,
Input_i, Hint}, TimeoutMs_i}``: each is checked and answered as it would be
alone, and since they share kernel, size and hint, a check that refuses one
refuses all N (each ReqId hears it).

The node's bytes (kem_port.erl writes the head by hand) are read here with
one pass of ``struct`` (:func:`read_fields`); any other valid spelling of the
term (``term_to_binary`` output with ATOM_EXT, a hint written as a big
integer) is decoded by the general decoder (terms.decode_request, with the
etf_guard walk) and read from the term (:func:`fields_of_term`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from kem_port.wire import terms
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.wire.protocol import kernel_call
from kem_port.wire.narrow_decode import _atom_forms

MIN_CALLS, MAX_CALLS = 2, 256
ENTRY = struct.Struct(">QI")  # ReqId, TimeoutMs
# Entries as numpy records: ReqIds and timeouts of a group in one call each.
ENTRY_DTYPE = np.dtype([("req_id", ">u8"), ("timeout_ms", ">u4")])
_VERSION, _TUPLE, _BINARY = 131, 104, 109
_SMALL_INTEGER, _INTEGER, _SMALL_BIG = 97, 98, 110
GROUP_HEADS = tuple(bytes([_VERSION, _TUPLE, 5]) + form for form in _atom_forms(b"group"))
NODE_HEAD = GROUP_HEADS[0]  # SMALL_ATOM_UTF8_EXT, what OTP 26+ and kem_port.erl write
_U32 = struct.Struct(">I")
_u32 = _U32.unpack_from
_i32 = struct.Struct(">i").unpack_from


@dataclass(frozen=True, slots=True)
class GroupFields:
    """The four fields of a group term as read, not yet checked: bytes for
    a binary, the decoded term for anything else (refused by check())."""

    kernel_id: Any
    hint: Any
    entries: Any
    inputs: Any


@dataclass(frozen=True, slots=True)
class Group:
    """A checked group: N calls of `size` input bytes and `output_size`
    output bytes each to `kernel_id`."""

    kernel_id: str
    req_ids: list[int]
    entries: np.ndarray  # ENTRY_DTYPE records: each call's req_id and timeout_ms (0: none)
    inputs: bytes | memoryview  # N * size bytes
    size: int
    output_size: int

    @property
    def n(self) -> int:
        return len(self.req_ids)


class GroupRefused(Exception):
    """Every call of a group is answered with one error."""

    def __init__(self, req_ids: list[int], error: KemError) -> None:
        super().__init__(str(error))
        self.req_ids = req_ids
        self.error = error


def is_group_frame(frame: bytes) -> bool:
    return frame.startswith(GROUP_HEADS)


def read_fields(frame: bytes) -> GroupFields | None:
    """The fields of a group frame spelled with a 5-tuple, binaries and a
    small, 32-bit or big integer hint, exactly to the frame's end; None for
    any other bytes (decode them in general, then fields_of_term). The
    inputs are a view of the frame, not a copy."""
    if not frame.startswith(GROUP_HEADS):
        return None
    pos = len(GROUP_HEADS[0]) if frame.startswith(NODE_HEAD) else _head_length(frame)
    try:
        pos, kernel_id = _binary_at(frame, pos)
        pos, hint = _integer_at(frame, pos)
        pos, entries = _binary_at(frame, pos)
        start, end = _binary_span(frame, pos)
    except (IndexError, struct.error, ValueError):
        return None
    if end != len(frame):
        return None
    return GroupFields(bytes(kernel_id), hint, bytes(entries), memoryview(frame)[start:end])


def _head_length(frame: bytes) -> int:
    return next(len(head) for head in GROUP_HEADS if frame.startswith(head))


def _binary_span(frame: bytes, pos: int) -> tuple[int, int]:
    if frame[pos] != _BINARY:
        raise ValueError("not a binary")
    start = pos + 5
    end = start + _u32(frame, pos + 1)[0]
    if end > len(frame):
        raise ValueError("past the end")
    return start, end


def _binary_at(frame: bytes, pos: int) -> tuple[int, bytes]:
    start, end = _binary_span(frame, pos)
    return end, frame[start:end]


def _integer_at(frame: bytes, pos: int) -> tuple[int, int]:
    tag = frame[pos]
    if tag == _SMALL_INTEGER:
        return pos + 2, frame[pos + 1]
    if tag == _INTEGER:
        return pos + 5, _i32(frame, pos + 1)[0]
    if tag == _SMALL_BIG:  # at most 255 bytes: linear to read, refused by size in check()
        size, sign = frame[pos + 1], frame[pos + 2]
        end = pos + 3 + size
        if end > len(frame):
            raise ValueError("past the end")
        value = int.from_bytes(frame[pos + 3 : end], "little")
        return end, -value if sign else value
    raise ValueError("not an integer")


def fields_of_term(term: Any) -> GroupFields | None:
    """The fields of a decoded ``{group, ...}`` term; None for other terms."""
    if not (isinstance(term, tuple) and len(term) == 5 and terms.atom_name(term[0]) == "group"):
        return None
    return GroupFields(*(_bytes_or_term(value) for value in term[1:]))


def _bytes_or_term(value: Any) -> Any:
    data = terms.binary_bytes(value)
    return data if data is not None else value


def req_ids_of(entries: Any) -> list[int] | None:
    """The distinct ReqIds of an Entries binary, in order; None when it is
    not a binary of whole entries (then no caller can be named)."""
    if not isinstance(entries, (bytes, memoryview)) or len(entries) % ENTRY.size:
        return None
    return list(dict.fromkeys(np.frombuffer(entries, ENTRY_DTYPE)["req_id"].tolist()))


def check(fields: GroupFields, config: Config) -> Group:
    """A Group, or GroupRefused (every ReqId hears it), or KemError when the
    Entries cannot be read (answered to ReqId undefined)."""
    req_ids = req_ids_of(fields.entries)
    if req_ids is None:
        raise KemError("bad_request", "a group's Entries must be a binary of 12-byte <<ReqId:64, TimeoutMs:32>> entries")
    if not req_ids:  # no caller to name: the frame is answered once, to undefined
        raise KemError("bad_request", f"a group holds {MIN_CALLS}-{MAX_CALLS} calls, not 0")
    records = np.frombuffer(fields.entries, ENTRY_DTYPE)
    n = len(records)
    if not MIN_CALLS <= n <= MAX_CALLS:
        raise GroupRefused(req_ids, KemError("bad_request", f"a group holds {MIN_CALLS}-{MAX_CALLS} calls, not {n}"))
    if len(req_ids) != n:
        raise GroupRefused(req_ids, KemError("bad_request", "a ReqId is repeated inside one group"))
    kernel_id, hint, inputs = fields.kernel_id, fields.hint, fields.inputs
    if not isinstance(kernel_id, bytes) or type(hint) is not int or not isinstance(inputs, (bytes, memoryview)):
        raise GroupRefused(req_ids, KemError("bad_request", "expected {group, KernelId, Hint, Entries, Inputs} with binaries and an integer Hint"))
    if not inputs or len(inputs) % n:
        raise GroupRefused(req_ids, KemError("bad_request", f"a group's Inputs must be {n} inputs of one size >= 1, not {len(inputs)} bytes"))
    size = len(inputs) // n
    try:
        # The checks one call of the group would get alone (all N share them).
        call = kernel_call("execute_kernel", (terms.Binary(kernel_id), terms.Binary(bytes(inputs[:size])), hint), config)
    except KemError as exc:
        raise GroupRefused(req_ids, exc) from None
    return Group(call.kernel_id, req_ids, records, inputs, size, call.output_size)


def req_ids_in_head(head: bytes) -> list[int] | None:
    """The ReqIds of a group frame too large to read, from its first bytes
    (framing.HEAD_KEPT of them); None when they are not all there."""
    if not head.startswith(GROUP_HEADS):
        return None
    try:
        pos, _ = _binary_at(head, _head_length(head))
        pos, _ = _integer_at(head, pos)
        _, entries = _binary_at(head, pos)
    except (IndexError, struct.error, ValueError):
        return None
    return req_ids_of(entries)


def encode_group(kernel_id: bytes, hint: int, entries: list[tuple[int, int]], inputs: list[bytes]) -> bytes:
    """A group frame as the node writes it (the client and tests; kem_port.erl
    writes the same bytes)."""
    if 0 <= hint < 256:
        hint_term = bytes([_SMALL_INTEGER, hint])
    elif -(2**31) <= hint < 2**31:
        hint_term = bytes([_INTEGER]) + struct.pack(">i", hint)
    else:
        magnitude = abs(hint).to_bytes((abs(hint).bit_length() + 7) // 8, "little")
        hint_term = bytes([_SMALL_BIG, len(magnitude), hint < 0]) + magnitude
    packed = b"".join(ENTRY.pack(req_id, timeout_ms) for req_id, timeout_ms in entries)
    blob = b"".join(inputs)
    return b"".join([
        NODE_HEAD, bytes([_BINARY]), _U32.pack(len(kernel_id)), kernel_id, hint_term,
        bytes([_BINARY]), _U32.pack(len(packed)), packed, bytes([_BINARY]), _U32.pack(len(blob)), blob,
    ])
