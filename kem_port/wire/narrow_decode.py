"""A narrow ETF decoder for kem's hot request shapes, erlang-py for the rest.

Every kernel request the node sends on the hot path is a tree of small
tuples, atoms, integers, binaries and small maps: ``{call, ReqId,
execute_kernel, {KernelId, Input, Hint}}``, its ``_with_params`` sibling,
and ``run``'s ``{KernelId, #{Name => Bytes}, #{outputs => ..., grid =>
{X, Y, Z}}}``. erlang-py
decodes one in 7.1 us on the dev machine (docs/codec.md); walking just
those five tags with ``struct.unpack_from`` takes a fraction of that
(scripts/bench_codec.py prints both). Anything else -- an improper list, a string, a float,
a big integer, a map keyed by anything but atoms, binaries and integers,
nesting past six levels, or any frame this walk does not consume
exactly -- goes to erlang-py (``terms.decode``), which stays the
judge of what is valid: a truncated frame or trailing bytes are never
accepted here, they fall through and erlang-py refuses them.

The values returned are the ones erlang-py returns for the same bytes
(``OtpErlangAtom``, ``OtpErlangBinary``, ``True``/``False``/``None`` for
those atoms); tests/test_request_fast.py checks that on random frames.

Its bounds are etf_guard's, imported from there (one definition): no tuple
wider than MAX_ARITY, no more than MAX_NODES terms, no atom over MAX_ATOM
bytes, no list over MAX_LIST, no integer over MAX_INT_BYTES, and its own depth of 6 is inside
MAX_DEPTH. A frame past any of them is left to the guarded road, which
refuses it (``bad_frame``/``too_large`` to its ReqId). Without them a 13 MB
frame of 255-wide tuples of empty binaries took this road and grew to
250 MB of erlang-py objects (issue 24); tests/test_decoder_bounds.py fuzzes
every ETF spelling against the guard's walk.
"""

from __future__ import annotations

import struct
from typing import Any

import erlang

from kem_port.wire.etf_guard import MAX_ARITY, MAX_ATOM, MAX_DEPTH, MAX_INT_BYTES, MAX_LIST, MAX_NODES

_VERSION = 131
_SMALL_INTEGER = 97
_INTEGER = 98
_ATOM = 100
_SMALL_TUPLE = 104
_BINARY = 109
_MAP = 116
_NIL = 106
_LIST = 108
_SMALL_BIG = 110
_SMALL_ATOM = 115
_ATOM_UTF8 = 118
_SMALL_ATOM_UTF8 = 119
_MAX_DEPTH = 6  # {call, _, chain, {[#{workgroups => {X, Y, Z}}], _}} is the deepest hot shape
assert _MAX_DEPTH < MAX_DEPTH  # the guard's walk counts the root as one level more
_SPECIAL_ATOMS: dict[bytes, Any] = {b"true": True, b"false": False, b"undefined": None}

_ATOM_CACHE = 256
_MISSING = object()
_atoms: dict[bytes, Any] = {}  # atom encodings seen -> the value erlang-py gives them

_Binary = erlang.OtpErlangBinary


class CachedAtom(erlang.OtpErlangAtom):
    """erlang-py's atom, its encoding kept: erlang-py's own __hash__ and
    __eq__ encode it again on every use (~1 us), and a frame's map keys
    are hashed as they are stored and looked up (7% of a loaded port's
    reader on the H100 at 64 callers of 10-step chains, py-spy). Equal to,
    and hashed as, erlang-py's atom of the same name; the cache below
    makes one per spelling."""

    def __init__(self, value: str | bytes) -> None:
        super().__init__(value)
        self._encoded = erlang.OtpErlangAtom.binary(self)
        self._hash = hash(self._encoded)

    def binary(self) -> bytes:
        return self._encoded

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, erlang.OtpErlangAtom) and self._encoded == other.binary()

# undefined is an atom too; true and false are not taken (True == 1 and
# False == 0 in a dict: etf_guard refuses such a key, MAP_KEY_CLASH).
_MAP_KEYS = (CachedAtom, _Binary, int, type(None))  # exact types: erlang-py's own atom never comes from here
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
        i, items = _items(data, i + 1, data[i], data[i], MAX_ARITY, depth, budget)
        return i, tuple(items)
    if tag == _MAP:
        return _map(data, i, depth, budget)
    if tag == _NIL:
        return i, []
    if tag == _LIST:
        return _list(data, i, depth, budget)
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
        # A sign byte past 1: erlang-py reads it positive, Erlang negative; left to the judge.
        if size > MAX_INT_BYTES or sign > 1 or i + 2 + size > len(data):
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


def _map(data: bytes, i: int, depth: int, budget: list[int]) -> tuple[int, dict]:
    """A map of atom, binary or integer keys, as erlang-py builds it (a key
    given twice: the last value, as its dict keeps; true and false keys are
    left to etf_guard, which refuses them). The ``run`` method's
    buffers and options are maps: erlang-py took 56 us of a 4-byte named
    call's frame on the dev machine, this walk ~10 (docs/codec.md)."""
    (arity,) = _uint32(data, i)
    budget[0] -= 2 * arity  # etf_guard counts a map's keys and values
    if depth >= _MAX_DEPTH or arity > MAX_ARITY or budget[0] < 0:
        raise _NotHot
    i += 4
    found: dict = {}
    for _ in range(arity):
        i, key = _term(data, i, depth + 1, budget)
        if type(key) not in _MAP_KEYS:  # erlang-py rebuilds tuple keys (to_immutable): not this road's
            raise _NotHot
        i, found[key] = _term(data, i, depth + 1, budget)
    return i, found


def _list(data: bytes, i: int, depth: int, budget: list[int]) -> tuple[int, list]:
    """A proper list, as erlang-py builds it (a Python list); an improper
    one (erlang-py's OtpErlangList) is not this road's. A chain's steps are
    a list of maps: erlang-py and the guard's walk took most of a 10-step
    chain frame's ~60 us on the dev machine."""
    (length,) = _uint32(data, i)
    # etf_guard counts the elements, then the tail
    i, items = _items(data, i + 4, length, length + 1, MAX_LIST, depth, budget)
    if data[i] != _NIL:
        raise _NotHot
    return i + 1, items


def _items(data: bytes, i: int, count: int, spent: int, most: int, depth: int, budget: list[int]) -> tuple[int, list]:
    """A tuple's or a list's ``count`` elements from i, within the guard's
    bounds (``spent`` terms off the budget before any is built)."""
    budget[0] -= spent
    if depth >= _MAX_DEPTH or count > most or budget[0] < 0:
        raise _NotHot
    items = []
    for _ in range(count):
        i, item = _term(data, i, depth + 1, budget)
        items.append(item)
    return i, items


def _atom(tag: int, name: bytes) -> Any:
    """The value erlang-py gives this atom; remembered while there are few
    (a frame of fresh atom names cannot grow the cache past _ATOM_CACHE)."""
    if name in _SPECIAL_ATOMS:
        value = _SPECIAL_ATOMS[name]
    else:
        value = CachedAtom(name.decode("utf-8") if tag in (_ATOM_UTF8, _SMALL_ATOM_UTF8) else name)
    if len(_atoms) < _ATOM_CACHE:
        _atoms[bytes([tag]) + (len(name).to_bytes(1 if tag in (_SMALL_ATOM, _SMALL_ATOM_UTF8) else 2, "big")) + name] = value
    return value


def _atom_forms(name: bytes) -> tuple[bytes, ...]:
    """The four encodings of one atom: OTP 26+ writes SMALL_ATOM_UTF8, OTP 25
    ATOM_EXT, erlang-py SMALL_ATOM_UTF8; the other two are legal too."""
    n = len(name)
    return (bytes([_SMALL_ATOM_UTF8, n]) + name, bytes([_ATOM, 0, n]) + name,
            bytes([_SMALL_ATOM, n]) + name, bytes([_ATOM_UTF8, 0, n]) + name)
