"""A narrow ETF decoder for kem's hot request shapes, erlang-py for the rest.

Every kernel request the node sends on the hot path is a tree of small
tuples, atoms, integers and binaries: ``{call, ReqId, execute_kernel,
{KernelId, Input, Hint}}`` and its ``_with_params`` sibling. erlang-py
decodes one in 7.1 us on the dev machine (docs/codec.md); walking just
those five tags with ``struct.unpack_from`` takes a fraction of that
(scripts/bench_codec.py prints both). Anything else -- a map (``execute``
options), a list, a float, a big integer, or any frame this walk does not
consume exactly -- goes to erlang-py (``terms.decode``), which stays the
judge of what is valid: a truncated frame or trailing bytes are never
accepted here, they fall through and erlang-py refuses them.

The values returned are the ones erlang-py returns for the same bytes
(``OtpErlangAtom``, ``OtpErlangBinary``, ``True``/``False``/``None`` for
those atoms); tests/test_request_fast.py checks that on random frames.

Its bounds are etf_guard's, imported from there (one definition): no tuple
wider than MAX_ARITY, no more than MAX_NODES terms, no atom over MAX_ATOM
bytes, no integer over MAX_INT_BYTES, and its own depth of 4 is inside
MAX_DEPTH. A frame past any of them is left to the guarded road, which
refuses it (``bad_frame``/``too_large`` to its ReqId). Without them a 13 MB
frame of 255-wide tuples of empty binaries took this road and grew to
250 MB of erlang-py objects (issue 24); tests/test_decoder_bounds.py fuzzes
every ETF spelling against the guard's walk.
"""

from __future__ import annotations

import re
import struct
import time
from typing import Any

import erlang

from kem_port.config import Config
from kem_port.gpu.calls import KernelCall
from kem_port.wire.etf_guard import MAX_ARITY, MAX_ATOM, MAX_DEPTH, MAX_INT_BYTES, MAX_NODES
from kem_port.wire.request_types import KernelRequest

MAX_REQ_ID = (1 << 64) - 1
KERNEL_ID_BYTES = re.compile(rb"[A-Za-z0-9_-]{1,128}")  # protocol.KERNEL_ID on the raw bytes

_VERSION = 131
_SMALL_INTEGER = 97
_INTEGER = 98
_ATOM = 100
_SMALL_TUPLE = 104
_BINARY = 109
_SMALL_BIG = 110
_SMALL_ATOM = 115
_ATOM_UTF8 = 118
_SMALL_ATOM_UTF8 = 119
_MAX_DEPTH = 4  # {call, _, _, {_, _, {X, Y, Z}}} is the deepest hot shape
assert _MAX_DEPTH < MAX_DEPTH  # the guard's walk counts the root as one level more
_SPECIAL_ATOMS: dict[bytes, Any] = {b"true": True, b"false": False, b"undefined": None}

_ATOM_CACHE = 256
_MISSING = object()
_atoms: dict[bytes, Any] = {}  # atom encodings seen -> the value erlang-py gives them

_Atom = erlang.OtpErlangAtom
_Binary = erlang.OtpErlangBinary
_int32 = struct.Struct(">i").unpack_from
_uint32 = struct.Struct(">I").unpack_from
_uint16 = struct.Struct(">H").unpack_from


class _NotHot(Exception):
    """This frame is not one of the hot shapes: let erlang-py decode it."""


def decode_hot(frame: bytes) -> Any | None:
    """The term in `frame` if it is built only of the hot tags and ends
    exactly at the frame's end; otherwise None (decode with erlang-py)."""
    if len(frame) < 2 or frame[0] != _VERSION:
        return None
    try:
        # Terms still allowed after the root: each tuple spends its arity
        # before any of its elements is built, so a refused frame costs at
        # most MAX_NODES small objects (~2 MB), whatever its size.
        end, term = _term(frame, 1, 0, [MAX_NODES - 1])
    except (_NotHot, IndexError, struct.error, UnicodeDecodeError):
        return None
    return term if end == len(frame) else None


def _term(data: bytes, i: int, depth: int, budget: list[int]) -> tuple[int, Any]:
    tag = data[i]
    i += 1
    if tag == _SMALL_TUPLE:
        arity = data[i]
        budget[0] -= arity
        if depth >= _MAX_DEPTH or arity > MAX_ARITY or budget[0] < 0:
            raise _NotHot
        i += 1
        items = []
        for _ in range(arity):
            i, item = _term(data, i, depth + 1, budget)
            items.append(item)
        return i, tuple(items)
    if tag == _BINARY:
        (size,) = _uint32(data, i)
        start = i + 4
        end = start + size
        if end > len(data):
            raise _NotHot
        return end, _Binary(data[start:end], 8)
    if tag == _SMALL_INTEGER:
        return i + 1, data[i]
    if tag == _INTEGER:
        return i + 4, _int32(data, i)[0]
    if tag == _SMALL_BIG:
        size, sign = data[i], data[i + 1]
        if size > MAX_INT_BYTES or i + 2 + size > len(data):
            raise _NotHot
        value = int.from_bytes(data[i + 2 : i + 2 + size], "little")
        return i + 2 + size, -value if sign else value
    if tag in (_SMALL_ATOM, _SMALL_ATOM_UTF8):
        size, start = data[i], i + 1
    elif tag in (_ATOM, _ATOM_UTF8):
        size, start = _uint16(data, i)[0], i + 2
    else:
        raise _NotHot
    end = start + size
    if end > len(data) or size > MAX_ATOM:
        raise _NotHot
    key = data[i - 1 : end]  # tag, length and name: one atom, one key
    found = _atoms.get(key, _MISSING)
    if found is _MISSING:
        found = _atom(tag, data[start:end])
    return end, found


def _atom(tag: int, name: bytes) -> Any:
    """The value erlang-py gives this atom; remembered while there are few
    (a frame of fresh atom names cannot grow the cache past _ATOM_CACHE)."""
    if name in _SPECIAL_ATOMS:
        value = _SPECIAL_ATOMS[name]
    else:
        value = _Atom(name.decode("utf-8") if tag in (_ATOM_UTF8, _SMALL_ATOM_UTF8) else name)
    if len(_atoms) < _ATOM_CACHE:
        _atoms[bytes([tag]) + (len(name).to_bytes(1 if tag in (_SMALL_ATOM, _SMALL_ATOM_UTF8) else 2, "big")) + name] = value
    return value


def _atom_forms(name: bytes) -> tuple[bytes, ...]:
    """The four encodings of one atom: OTP 26+ writes SMALL_ATOM_UTF8, OTP 25
    ATOM_EXT, erlang-py SMALL_ATOM_UTF8; the other two are legal too."""
    n = len(name)
    return (bytes([_SMALL_ATOM_UTF8, n]) + name, bytes([_ATOM, 0, n]) + name,
            bytes([_SMALL_ATOM, n]) + name, bytes([_ATOM_UTF8, 0, n]) + name)


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
