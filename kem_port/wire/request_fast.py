"""The hot kernel request read straight off a frame's bytes.

``{call, ReqId, execute_kernel, {KernelId, Input, Hint}, TimeoutMs}`` is
the one request the node sends for nearly every small call: read here in
one pass with no term objects, or left to the narrow decoder
(narrow_decode.py, re-exported here as decode_hot) and erlang-py.
"""

from __future__ import annotations

import re
import struct
import time

from kem_port.config import Config
from kem_port.gpu.calls import KernelCall
from kem_port.wire.etf_guard import MAX_INT_BYTES
from kem_port.wire.narrow_decode import (_BINARY, _INTEGER, _SMALL_BIG, _SMALL_INTEGER, _SMALL_TUPLE, _VERSION, _NotHot,
                                         _atom_forms, _int32, _uint32, decode_hot)
from kem_port.wire.request_types import KernelRequest

__all__ = ["MAX_REQ_ID", "decode_hot", "execute_kernel_fields", "hot_execute_kernel"]

MAX_REQ_ID = (1 << 64) - 1
KERNEL_ID_BYTES = re.compile(rb"[A-Za-z0-9_-]{1,128}")  # protocol.KERNEL_ID on the raw bytes

_EXECUTE_HEADS = tuple(bytes([_VERSION, _SMALL_TUPLE, 5]) + form for form in _atom_forms(b"call"))
_EXECUTE_METHODS = tuple(form + bytes([_SMALL_TUPLE, 3, _BINARY]) for form in _atom_forms(b"execute_kernel"))
# A usage call (docs/metering.md): {KernelId, Input, Hint, usage}, the hot
# shape and one atom, so dev_kem's calls keep this road and the lone kit's:
# sent as `execute` with usage => true they cost ~120 us more a call on
# lavapipe (kem_gas_usage_tests:what_asking_costs; 269.5 us against 260.5
# for the hot call without usage, same run).
_USAGE_METHODS = tuple(form + bytes([_SMALL_TUPLE, 4, _BINARY]) for form in _atom_forms(b"execute_kernel"))
_USAGE_ATOMS = _atom_forms(b"usage")


def execute_kernel_fields(frame: bytes) -> tuple[int, bytes, bytes, int, int, bool] | None:
    """(ReqId, KernelId, Input, Hint, TimeoutMs, Usage) when frame is exactly
    ``{call, ReqId, execute_kernel, {KernelId, Input, Hint}, TimeoutMs}``
    with binaries and non-negative integers, the one request the node sends
    for nearly every small call, or its usage form ``{KernelId, Input, Hint,
    usage}`` (Usage true); otherwise None (decode_hot and erlang-py).

    One pass over the bytes and no term objects: 1.1 us (2.7 us with
    hot_execute_kernel's checks and the KernelCall) against 6.5 us for
    decode_hot's walk plus parse_call and kernel_call on the same frame
    (timeit on the dev machine). The values are unchecked: the
    caller (hot_execute_kernel) applies kem's limits."""
    for head in _EXECUTE_HEADS:
        if frame.startswith(head):
            break
    else:
        return None
    end = len(frame)
    try:
        # The node's integers are SMALL_INTEGER or INTEGER but for ReqIds
        # from 2^31: those two read here, the rest by _uint_at (three
        # Python calls fewer a frame, where each costs ~1 us with the
        # caches cold: docs/benchmarks.md).
        pos = len(head)
        tag = frame[pos]
        if tag == _SMALL_INTEGER:
            req_id, pos = frame[pos + 1], pos + 2
        elif tag == _INTEGER:
            req_id, pos = _int32(frame, pos + 1)[0], pos + 5
            if req_id < 0:
                return None
        else:
            pos, req_id = _uint_at(frame, pos)
        usage = False
        for method in _EXECUTE_METHODS:
            if frame.startswith(method, pos):
                break
        else:
            for method in _USAGE_METHODS:
                if frame.startswith(method, pos):
                    usage = True
                    break
            else:
                return None
        start = pos + len(method) + 4
        pos = start + _uint32(frame, start - 4)[0]
        kernel_id = frame[start:pos]
        if frame[pos] != _BINARY:
            return None
        start = pos + 5
        pos = start + _uint32(frame, pos + 1)[0]
        if pos > end:
            return None
        data = frame[start:pos]
        if frame[pos] == _SMALL_INTEGER:
            hint, pos = frame[pos + 1], pos + 2
        else:
            pos, hint = _uint_at(frame, pos)
        if usage:
            pos = _usage_end(frame, pos)
        if frame[pos] == _INTEGER:
            timeout_ms, pos = _int32(frame, pos + 1)[0], pos + 5
            if timeout_ms < 0:
                return None
        else:
            pos, timeout_ms = _uint_at(frame, pos)
    except (_NotHot, IndexError, struct.error):
        return None
    return (req_id, kernel_id, data, hint, timeout_ms, usage) if pos == end else None


def _usage_end(frame: bytes, pos: int) -> int:
    """Where the atom ``usage`` at pos ends; _NotHot if it is not there."""
    for atom in _USAGE_ATOMS:
        if frame.startswith(atom, pos):
            return pos + len(atom)
    raise _NotHot


def _uint_at(data: bytes, i: int) -> tuple[int, int]:
    """A non-negative integer of at most 8 bytes at i: (end, value)."""
    tag = data[i]
    if tag == _SMALL_INTEGER:
        return i + 2, data[i + 1]
    if tag == _INTEGER:
        value = _int32(data, i + 1)[0]
        if value < 0:
            raise _NotHot
        return i + 5, value
    if tag == _SMALL_BIG:
        size, sign = data[i + 1], data[i + 2]
        end = i + 3 + size
        if size > MAX_INT_BYTES or sign or end > len(data):
            raise _NotHot
        return end, int.from_bytes(data[i + 3 : end], "little")
    raise _NotHot


def hot_execute_kernel(frame: bytes, config: Config) -> KernelRequest | None:
    """The hot KernelRequest of a frame that is exactly a valid
    ``{call, ReqId, execute_kernel, {KernelId, Input, Hint}, TimeoutMs}``
    within kem's limits, read straight off the bytes
    (execute_kernel_fields); None for any other frame,
    including one that breaks a limit: decode_request, parse_call and
    kernel_call then read it and give the exact refusal. Every check here
    is theirs: the ReqId and TimeoutMs ranges, the kernel id's characters,
    the input and output sizes before anything is allocated. The hot shape
    is bounded by construction (no lists, maps or deep nesting), so the
    etf_guard walk has nothing to refuse in it."""
    fields = execute_kernel_fields(frame)
    if fields is None:
        return None
    req_id, kernel_id, data, hint, timeout_ms, usage = fields
    if not (
        req_id <= MAX_REQ_ID
        and 0 < timeout_ms <= MAX_REQ_ID
        and 0 < hint <= config.max_output_bytes
        and len(data) <= config.max_input_bytes
        and len(data) * hint <= config.max_output_bytes
        and KERNEL_ID_BYTES.fullmatch(kernel_id)
    ):
        return None
    timeout_s = timeout_ms / 1000.0
    call = KernelCall(kernel_id.decode("ascii"), data, len(data) * hint)
    if usage:
        call.usage = True
    # tuple.__new__ straight: the named tuple's own __new__ is one more
    # Python call, ~1 us on a GPU host after the driver's wait (the reader's
    # parse stage, scripts/bench_lone.py --router on the H100: 4.4-4.9 us
    # before the typed request, 8.2-9.6 with it).
    return tuple.__new__(KernelRequest, (req_id, call, time.monotonic() + timeout_s, timeout_s, True))
