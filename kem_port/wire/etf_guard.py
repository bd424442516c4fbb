"""A bounded walk over a frame's external term format, before it is decoded.

erlang-py builds every term it meets: an integer of N digits costs it
O(N^2) (a 1 MB JSON-derived number kept the reader busy past the call
timeout), and list-heavy frames grew ~75x in memory. kem's requests are
small shapes -- ``{call, ReqId, Method, Args}`` with atoms, integers below
2^64, binaries, one small options map and 3-tuples -- so this walk refuses,
in one linear pass that allocates nothing per element, any frame with:

* an integer wider than 8 bytes (``too_large``: an argument out of range);
* more than MAX_NODES terms, lists or strings longer than MAX_LIST, tuples
  or maps wider than MAX_ARITY, nesting deeper than MAX_DEPTH, atoms over
  255 bytes, pids, ports, references, funs, compressed terms or tags kem
  never uses (``bad_frame``: no request of kem's has that shape).

Only a frame that passes is handed to erlang-py (terms.decode).
"""

from __future__ import annotations

from kem_port.errors import KemError, too_large

MAX_INT_BYTES = 8  # kem's widest integer is a ReqId below 2^64
MAX_DEPTH = 16  # {call, Id, M, {K, I, #{workgroups => {X,Y,Z}}}} is 4 deep
MAX_LIST = 4096
MAX_ARITY = 64
MAX_NODES = 10_000
MAX_ATOM = 255

VERSION = 131
_FIXED = {97: 1, 98: 4, 70: 8, 99: 31, 106: 0}  # small int, int, floats, nil
_ATOMS = {100: 2, 115: 1, 118: 2, 119: 1}  # tag -> width of the length field
_BIGS = {110: 1, 111: 4}
_TUPLES = {104: 1, 105: 4}
STRING, LIST, BINARY, BIT_BINARY, MAP = 107, 108, 109, 77, 116
_NAMES = {80: "compressed term", 88: "pid", 103: "pid", 90: "reference", 114: "reference", 101: "reference",
          89: "port", 102: "port", 120: "port", 112: "fun", 117: "fun", 113: "export"}


def bad_frame(detail: str) -> KemError:
    """A whole term kem refuses (a pid, a fun, a list too long): it may sit
    in the arguments of a well-formed call, so its caller is answered."""
    return KemError("bad_frame", detail)


class Malformed(KemError):
    """Bytes that are not one whole term: such a frame names no caller."""


def malformed(detail: str) -> KemError:
    return Malformed("bad_frame", detail)


# {call, ReqId, Method, Args} and {call, ReqId, Method, Args, TimeoutMs}, the
# atom in each of its four encodings.
_CALL_HEAD = tuple(
    bytes([VERSION, 104, arity]) + atom + b"call"
    for arity in (4, 5)
    for atom in (bytes([119, 4]), bytes([100, 0, 4]), bytes([115, 4]), bytes([118, 0, 4]))
)


def peek_req_id(frame: bytes) -> int | None:
    """The ReqId of a refused frame that starts like ``{call, ReqId, ...}``,
    so its caller hears the refusal instead of timing out; None otherwise."""
    for head in _CALL_HEAD:
        if frame.startswith(head):
            return _small_uint(_Reader(frame), len(head))
    return None


def _small_uint(reader: "_Reader", pos: int) -> int | None:
    reader.pos = pos
    try:
        tag = reader.uint(1)
        if tag == 97:
            return reader.uint(1)
        if tag == 98:
            value = reader.uint(4)
            return value if value < 1 << 31 else None
        if tag == 110:
            size, sign = reader.uint(1), reader.uint(1)
            if size <= MAX_INT_BYTES and sign == 0:
                return int.from_bytes(reader.frame[reader.pos : reader.pos + size], "little") if reader.pos + size <= len(reader.frame) else None
    except KemError:
        pass
    return None


class FrameError(KemError):
    """A refused frame, with the ReqId it named when that could be read."""

    def __init__(self, error: KemError, req_id: int | None) -> None:
        super().__init__(error.reason, error.detail)
        self.req_id = req_id


class _Reader:
    __slots__ = ("frame", "pos")

    def __init__(self, frame: bytes) -> None:
        self.frame = frame
        self.pos = 0

    def uint(self, width: int) -> int:
        end = self.pos + width
        if end > len(self.frame):
            raise malformed("term ends early")
        value = int.from_bytes(self.frame[self.pos : end], "big")
        self.pos = end
        return value

    def skip(self, count: int) -> None:
        if self.pos + count > len(self.frame):
            raise malformed("term ends early")
        self.pos += count


def check_frame(frame: bytes) -> None:
    """Raise KemError unless frame is one term kem's requests can be.

    Positions are plain ints and fields are read in place: a small call's
    frame costs ~7 us here, against ~13 us for erlang-py to decode it
    (timeit on the dev machine under load)."""
    end = len(frame)
    if end < 2 or frame[0] != VERSION:
        raise malformed("not an external term (version byte)")
    pos = 1
    # pending[i]: how many terms the open container at depth i still holds;
    # a map's count is negative (-2 x its arity, counted up to 0), so its
    # keys, at the even counts, are told apart at one comparison a term.
    pending = [1]
    nodes = 0
    try:
        while pending:
            count = pending[-1]
            if count > 0:
                pending[-1] = count - 1
            elif count < 0:
                pending[-1] = count + 1
                if not count & 1 and frame.startswith(MAP_KEY_CLASH, pos):
                    raise bad_frame("a map key true, false or a float is not accepted: kem's maps are keyed by names "
                                    "and binding numbers, and would read true as 1, false as 0, 1.0 as 1")
            else:
                pending.pop()
                continue
            nodes += 1
            if nodes > MAX_NODES:
                raise bad_frame(f"the request holds more than {MAX_NODES} terms")
            pos, children = _term(frame, pos)
            if pos > end:
                raise malformed("term ends early")
            if children:
                if len(pending) >= MAX_DEPTH:
                    raise bad_frame(f"the request nests deeper than {MAX_DEPTH}")
                pending.append(children)
    except IndexError:
        raise malformed("term ends early") from None
    if pos != end:
        raise malformed("bytes after the term")


# Map keys that are two keys in Erlang and one in a Python dict: true == 1,
# false == 0, 1.0 == 1 (erlang-py's map is a dict). #{0 => A, false => B}
# decoded to {0: B}: kem:run/3 ran B at binding 0 and A went unread.
# kem's maps are keyed by names and binding numbers, never by these: each
# spelling of the two atoms (four atom tags), and both float tags.
MAP_KEY_CLASH = tuple(bytes([tag]) + length + name for name in (b"true", b"false")
                      for tag, length in ((119, bytes([len(name)])), (115, bytes([len(name)])),
                                          (100, bytes([0, len(name)])), (118, bytes([0, len(name)])))) + (b"F", b"c")


def _uint(frame: bytes, pos: int, width: int) -> int:
    if pos + width > len(frame):
        raise IndexError
    return int.from_bytes(frame[pos : pos + width], "big")


def _term(frame: bytes, pos: int) -> tuple[int, int]:
    """Skip one term's own bytes: (position after them, sub-terms that
    follow, negative for a map's)."""
    tag = frame[pos]
    pos += 1
    fixed = _FIXED.get(tag)
    if fixed is not None:
        return pos + fixed, 0
    width = _ATOMS.get(tag)
    if width is not None:
        size = _uint(frame, pos, width)
        if size > MAX_ATOM:
            raise bad_frame("atom longer than 255 bytes")
        return pos + width + size, 0
    if tag == BINARY:
        return pos + 4 + _uint(frame, pos, 4), 0
    if tag in _TUPLES:
        width = _TUPLES[tag]
        return pos + width, _bounded(_uint(frame, pos, width), MAX_ARITY, "a tuple")
    if tag in _BIGS:
        width = _BIGS[tag]
        digits = _uint(frame, pos, width)
        if digits > MAX_INT_BYTES:
            raise too_large(f"an integer of {digits} bytes; kem's integers fit in {MAX_INT_BYTES}")
        return pos + width + 1 + digits, 0
    if tag == MAP:  # negative: check_frame counts a map's terms up, keys at the even counts
        return pos + 4, -2 * _bounded(_uint(frame, pos, 4), MAX_ARITY, "a map")
    if tag == LIST:
        return pos + 4, _bounded(_uint(frame, pos, 4), MAX_LIST, "a list") + 1  # elements, then the tail
    if tag == STRING:
        return pos + 2 + _bounded(_uint(frame, pos, 2), MAX_LIST, "a string"), 0
    if tag == BIT_BINARY:
        return pos + 5 + _uint(frame, pos, 4), 0
    raise bad_frame(f"{_NAMES.get(tag, f'term tag {tag}')} is not accepted in a request")


def _bounded(count: int, limit: int, what: str) -> int:
    if count > limit:
        raise bad_frame(f"{what} of {count} elements; kem accepts at most {limit}")
    return count
