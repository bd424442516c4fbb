"""Erlang terms in and out, through erlang-py (docs/codec.md says why).

Two settings make the library safe for frames from anyone:

* compressed terms (tag 80) are refused. erlang-py inflates them completely
  before checking the declared size, so a small frame could expand to
  gigabytes; the node never sends them.
* recursion depth: deep nesting raises RecursionError inside the library; it
  is caught here and reported like any other malformed frame.

And before erlang-py sees a frame at all, etf_guard.check_frame walks it in
linear time and refuses integers, lists, maps and nesting beyond what kem's
requests can hold.

Encoding wraps Python values explicitly: ``bytes`` -> binary, :func:`atom`
-> atom. (erlang-py would send plain ``bytes`` or ``str`` as a charlist.)
"""

from __future__ import annotations

import struct
from typing import Any

import erlang

from kem_port.errors import KemError
from kem_port.wire.etf_guard import FrameError, Malformed, check_frame, peek_req_id
from kem_port.wire.narrow_decode import decode_hot

# erlang-py consults this module constant when it meets a compressed term;
# pointing it at an impossible tag turns tag 80 into "invalid tag".
erlang._TAG_COMPRESSED_ZLIB = -1

Atom = erlang.OtpErlangAtom
Binary = erlang.OtpErlangBinary
_ATOMS: dict[str, Atom] = {}


def atom(name: str) -> Atom:
    cached = _ATOMS.get(name)
    if cached is None:
        cached = _ATOMS[name] = Atom(name)
    return cached


def atom_name(value: Any) -> str | None:
    """The name of an atom term, or None when value is not an atom."""
    if isinstance(value, Atom):
        name = value.value
        if isinstance(name, bytes):
            return name.decode("latin-1")
        if isinstance(name, str):
            return name
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "undefined"
    return None


# erlang-py's Python types by Erlang's names for them (a bitstring is an OtpErlangBinary)
_KINDS = {"dict": "map", "frozendict": "map", "list": "list", "tuple": "tuple", "binary": "bitstring", "pid": "pid",
          "port": "port", "reference": "reference", "function": "fun"}


def shown(value: Any, limit: int = 40) -> str:
    """A caller's term as a reply names it, in plain words: an atom or a
    binary by its text (quoted, non-printable bytes escaped, at most
    `limit` characters), a number as itself, anything else by its kind,
    never Python's repr of erlang-py's classes (OtpErlangAtom('x'))."""
    text = atom_name(value)
    if text is None:
        # erlang-py gives an Erlang string (STRING_EXT) as bytes: its text too
        raw = value if type(value) is bytes else binary_bytes(value)
        if raw is None:
            if type(value) in (int, float):
                return str(value)
            kind = type(value).__name__.removeprefix("OtpErlang").lower()
            return f"a {_KINDS.get(kind, 'term')}"  # Erlang's words, not Python's (a dict, a frozendict)
        text = raw[: limit + 1].decode("ascii", "backslashreplace")
    # Only the first limit + 1 characters can show (each escapes to one or
    # more): escaping a 64 MiB key whole held the port's reader 23 s.
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return "'" + (text if len(text) <= limit else text[:limit] + "...") + "'"


def unknown_key(key: Any, known: tuple[str, ...], key_name: str) -> str:
    """A refusal of a key not in `known`; a binary or an Erlang string
    spelling a known key (<<"kernel">> or "kernel" for kernel) is said to be
    one, as `shown` prints all three alike."""
    raw, kind = binary_bytes(key), "a binary"
    if type(key) is bytes:  # erlang-py gives an Erlang string (STRING_EXT) as bytes
        raw, kind = key, "a string"
    if raw is not None and len(raw) <= 64 and raw.decode("latin-1") in known:  # bounded: a key may be MiBs
        return f"{key_name} {shown(key)} is {kind}; keys are atoms: {raw.decode('latin-1')} => ..."
    return f"unknown {key_name} {shown(key)}; known: {', '.join(known)}"


def binary_bytes(value: Any) -> bytes | None:
    """The bytes of a binary term (whole bytes only), or None."""
    if isinstance(value, Binary) and value.bits == 8 and isinstance(value.value, bytes):
        return value.value
    return None


def decode_request(frame: bytes) -> Any:
    """A frame from the pipe. The hot decoder (request_fast.py) keeps to
    etf_guard's bounds itself and leaves any frame past them here; any
    frame it does not take is walked first (etf_guard.py), since
    erlang-py's decoding of large integers is quadratic and its lists
    amplify memory ~75x."""
    term = decode_hot(frame)
    if term is not None:
        return term
    try:
        check_frame(frame)
        return _library_decode(frame)
    except KemError as exc:
        # A whole term refused inside a call is answered to its caller when
        # the frame starts with a call head: kem_port.erl writes {call,
        # ReqId, Method, _} itself, so the refused term is in the arguments
        # (anything a kem_port:call/4 caller passed: a pid, a fun, a huge
        # integer). Bytes that are not one whole term name no caller.
        raise FrameError(exc, None if isinstance(exc, Malformed) else peek_req_id(frame)) from None


def decode(frame: bytes) -> Any:
    """The term in one frame. Kernel requests take the narrow decoder
    (request_fast.py: 2.5 vs 5.7 us a small request); anything it does not
    consume exactly, erlang-py decodes or refuses."""
    term = decode_hot(frame)
    if term is not None:
        return term
    return _library_decode(frame)


def _library_decode(frame: bytes) -> Any:
    try:
        return erlang.binary_to_term(frame)
    except RecursionError:
        raise Malformed("bad_frame", "term nested too deeply") from None
    except (erlang.ParseException, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise Malformed("bad_frame", f"not a valid external term: {exc}") from None


def to_term(value: Any) -> Any:
    """Convert plain Python results (str, bytes, dict, list) to erlang-py terms."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Binary(bytes(value))
    if isinstance(value, str):
        return Binary(value.encode("utf-8"))
    if isinstance(value, Atom) or isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, dict):
        return {(atom(k) if isinstance(k, str) else to_term(k)): to_term(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(to_term(v) for v in value)
    if isinstance(value, list):
        return [to_term(v) for v in value]
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode(term: Any) -> bytes:
    return erlang.term_to_binary(term)


def _split_reply_template() -> tuple[bytes, bytes]:
    """The library's encoding of ``{reply, 0, {ok, <<>>}}``, cut around the 0.

    ETF is positional: the ReqId's bytes sit between the tuple header plus
    the ``reply`` atom and the ``{ok, <<>>}`` that follows. Splicing another
    ReqId's encoding there (and dropping the binary's zero length) gives the
    exact prefix of any ``{reply, ReqId, {ok, Payload}}``. tests/test_units.py
    checks it against the library on random ReqIds and payloads.
    """
    whole = encode((atom("reply"), 0, (atom("ok"), Binary(b""))))
    zero = encode(0)[1:]
    head = encode((atom("reply"),))[3:]  # the atom alone, after 131,h,1
    start = 3 + len(head)  # 131, SMALL_TUPLE_EXT, arity 3, then the atom
    assert whole[start : start + len(zero)] == zero and whole.endswith(b"m\x00\x00\x00\x00")
    return whole[:start], whole[start + len(zero) : -4]


REPLY_HEAD, REPLY_TAIL = _split_reply_template()


def _binary_reply_prefix(req_id: Any) -> bytes:
    """ETF of ``{reply, ReqId, {ok, <<>>}}`` less the 4-byte binary length.

    A binary's encoding ends the term here, so the prefix, a 4-byte length
    and the payload itself (written from wherever it lies) are the complete
    term, with no library copy of a payload that may be hundreds of MB.
    Encoding the whole envelope with erlang-py cost 11 us a reply; this
    costs one integer encode (scripts/bench_codec.py).
    """
    return REPLY_HEAD + req_id_term(req_id) + REPLY_TAIL


SMALL_INTS = tuple(bytes((97, n)) for n in range(256))  # SMALL_INTEGER_EXT


def req_id_term(req_id: Any) -> bytes:
    """ETF of a ReqId, less the version byte: the node's integers in the
    two fixed forms erlang-py gives them (SMALL_INTEGER_EXT, INTEGER_EXT),
    anything else through erlang-py. 0.1-0.2 us against 0.7 us for
    ``encode`` (timeit on the dev machine); tests/test_units.py compares
    the prefix with the library's on random ReqIds."""
    if type(req_id) is int:
        if 0 <= req_id < 256:
            return SMALL_INTS[req_id]
        if -(1 << 31) <= req_id < (1 << 31):
            return b"b" + req_id.to_bytes(4, "big", signed=True)
    return encode(req_id)[1:]


LENGTH = struct.Struct(">I")  # a frame's or a binary's length


def ok_binary_frame(req_id: Any, payload: bytes | memoryview) -> bytes:
    """``{reply, ReqId, {ok, Payload}}`` as one framed buffer (the 4-byte
    frame length first), for a small reply written alone: built in one
    function, as it runs after the GPU wait with the caches cold, where
    each Python call costs ~1 us (docs/benchmarks.md)."""
    size = len(payload)
    req = req_id_term(req_id)
    return b"".join((LENGTH.pack(len(REPLY_HEAD) + len(req) + len(REPLY_TAIL) + 4 + size),
                     REPLY_HEAD, req, REPLY_TAIL, LENGTH.pack(size), payload))


def ok_binary_reply(req_id: Any, payload: bytes | memoryview) -> list[bytes | memoryview]:
    """Buffers that together encode ``{reply, ReqId, {ok, Payload}}``."""
    return [_binary_reply_prefix(req_id) + struct.pack(">I", len(payload)), payload]


_GAS_MAP = b"t\x00\x00\x00\x01" + encode(atom("gas"))[1:]  # MAP_EXT of one pair, then the key


def ok_gas_reply(req_id: Any, payload: bytes | memoryview, gas: int) -> list[bytes | memoryview]:
    """Buffers that together encode ``{reply, ReqId, {ok, {Payload, #{gas =>
    Gas}}}}`` (a usage call's result, docs/metering.md), spliced as
    ok_binary_reply's prefix is: the payload is not copied, and the envelope
    costs what the lone reply's does, not an erlang-py encode of the whole."""
    head = REPLY_HEAD + req_id_term(req_id) + REPLY_TAIL[:-1] + b"h\x02m" + LENGTH.pack(len(payload))
    return [head, payload, _GAS_MAP + (SMALL_INTS[gas] if 0 <= gas < 256 else encode(gas)[1:])]


def ok_gas_frame(req_id: Any, payload: bytes | memoryview, gas: int) -> bytes:
    """ok_gas_reply as one framed buffer (the 4-byte frame length first), for
    the reader's lone reply (port/lone_call.py), as ok_binary_frame is."""
    parts = ok_gas_reply(req_id, payload, gas)
    return b"".join((LENGTH.pack(sum(len(p) for p in parts)), *parts))


def ok_named_reply(req_id: Any, outputs: dict[str, bytes]) -> list[bytes]:
    """Buffers that together encode ``{reply, ReqId, {ok, #{Name =>
    Bytes}}}`` (a call by named buffers, names as binaries), spliced as
    ok_binary_reply's prefix is: erlang-py's encode of the map cost ~10 us
    of a 4-byte named call on the dev machine. tests/test_units.py checks it
    against the library's."""
    parts = [REPLY_HEAD + req_id_term(req_id) + REPLY_TAIL[:-1] + b"t" + LENGTH.pack(len(outputs))]
    for name, data in outputs.items():
        key = name.encode()
        parts += (b"m" + LENGTH.pack(len(key)) + key + b"m" + LENGTH.pack(len(data)), data)
    return parts


def ok_reply(req_id: Any, result: Any) -> bytes:
    return encode((atom("reply"), req_id, (atom("ok"), to_term(result))))


def error_reply(req_id: Any, reason: str, detail: str) -> bytes:
    return encode((atom("reply"), req_id, (atom("error"), (atom(reason), Binary(detail.encode("utf-8", "replace"))))))
