"""The hot decoder (kem_port/request_fast.py) obeys the bounds of the
general one (kem_port/etf_guard.py), issue 24 item 6: whatever frame it
accepts, the guard's walk accepts, and its values are erlang-py's. A frame
of nested tuples once took the hot road past the bounds (+199 MiB, 20x its
size) while the same leaves in a list were refused.

The frames are written byte by byte here, in every encoding ETF has for
kem's terms (the node, erlang-py and a hostile caller each pick their own),
so the fuzz reaches spellings term_to_binary never writes."""

from __future__ import annotations

import os
import struct
import tracemalloc

import erlang
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import start_port
from kem_port.wire import terms
from kem_port.client import PortError
from kem_port.errors import KemError
from kem_port.wire.etf_guard import MAX_ARITY, MAX_ATOM, MAX_LIST, MAX_NODES, check_frame
from kem_port.wire.request_fast import decode_hot, execute_kernel_fields

REPEATS = (0, 1, 2, 3, MAX_ARITY - 1, MAX_ARITY, MAX_ARITY + 1, 255, 256, MAX_LIST, MAX_LIST + 1)
ATOM_SIZES = (0, 1, 4, MAX_ATOM, MAX_ATOM + 1, 300)
BYTES_CAP = 300_000  # a drawn frame's size: room for 10,000+ terms, quick to walk


# -- ETF spelled by hand ------------------------------------------------------

def small_tuple(items: list[bytes]) -> bytes:
    return b"h" + bytes([len(items)]) + b"".join(items)


def any_tuple(items: list[bytes]) -> bytes:
    """SMALL_TUPLE where it fits, else LARGE_TUPLE."""
    return small_tuple(items) if len(items) < 256 else b"i" + struct.pack(">I", len(items)) + b"".join(items)


def atom_bytes(name: bytes, tag: int) -> bytes:
    """An atom in one of its four encodings (SMALL_ATOM_UTF8 119, ATOM_UTF8
    118, ATOM 100, SMALL_ATOM 115); the small forms hold at most 255 bytes."""
    if tag in (115, 119):
        return bytes([tag, len(name)]) + name
    return bytes([tag]) + struct.pack(">H", len(name)) + name


def integer_bytes(value: int, form: str, sign_byte: int | None = None) -> bytes:
    """value in the form named (the widest form fits any value asked of it);
    a big form's sign byte may be given (2..255 is legal ETF: Erlang reads
    it negative, erlang-py positive)."""
    if form == "small" and 0 <= value < 256:
        return bytes([97, value])
    if form == "int" and -(1 << 31) <= value < 1 << 31:
        return b"b" + struct.pack(">i", value)
    digits = abs(value).to_bytes(max(1, (abs(value).bit_length() + 7) // 8), "little")
    sign = bytes([value < 0 if sign_byte is None else sign_byte])
    if form == "large":
        return b"o" + struct.pack(">I", len(digits)) + sign + digits
    return b"n" + bytes([len(digits)]) + sign + digits


def binary_bytes(data: bytes) -> bytes:
    return b"m" + struct.pack(">I", len(data)) + data


# -- strategies -----------------------------------------------------------------

integer_forms = st.sampled_from(["small", "int", "smallbig", "large"])
atom_tags = st.sampled_from([115, 119, 100, 118])


@st.composite
def integers(draw) -> bytes:
    width = draw(st.sampled_from([1, 4, 8, 9, 12]))  # bytes; past 8 the guard refuses
    value = draw(st.integers(-(1 << (8 * width)) + 1, (1 << (8 * width)) - 1))
    return integer_bytes(value, draw(integer_forms), draw(st.sampled_from([None, None, None, 2, 255])))


@st.composite
def atoms(draw) -> bytes:
    tag = draw(atom_tags)
    size = draw(st.sampled_from(ATOM_SIZES))
    if tag in (115, 119):
        size = min(size, 255)
    letter = draw(st.sampled_from([b"a", b"z", b"_"]))
    name = draw(st.sampled_from([b"call", b"true", b"false", b"undefined", b"execute_kernel", letter * size]))
    return atom_bytes(name, tag)


@st.composite
def leaves(draw) -> bytes:
    kind = draw(st.sampled_from(["int", "atom", "binary", "nil", "string", "float"]))
    if kind == "int":
        return draw(integers())
    if kind == "atom":
        return draw(atoms())
    if kind == "binary":
        return binary_bytes(draw(st.binary(max_size=20)))
    if kind == "nil":
        return b"j"
    if kind == "string":
        size = draw(st.sampled_from([0, 3, MAX_LIST, MAX_LIST + 1]))
        return b"k" + struct.pack(">H", size) + b"x" * size
    return b"F" + struct.pack(">d", draw(st.floats(allow_nan=False)))


@st.composite
def children(draw, depth: int) -> list[bytes]:
    """A few drawn terms, or one drawn term repeated: how 10,000 terms fit
    in a frame hypothesis can draw."""
    if draw(st.booleans()):
        return [draw(terms_bytes(depth + 1)) for _ in range(draw(st.integers(0, 4)))]
    child = draw(terms_bytes(depth + 1))
    count = min(draw(st.sampled_from(REPEATS)), BYTES_CAP // len(child))
    return [child] * count


@st.composite
def terms_bytes(draw, depth: int = 0) -> bytes:
    if depth >= 5 or draw(st.integers(0, 2)) == 0:
        return draw(leaves())
    items = draw(children(depth))
    kind = draw(st.sampled_from(["small_tuple", "small_tuple", "large_tuple", "list", "map"]))
    if kind == "small_tuple" and len(items) < 256:
        return small_tuple(items)
    if kind == "list":
        return b"l" + struct.pack(">I", len(items)) + b"".join(items) + b"j"
    if kind == "map":
        pairs = items[: len(items) // 2 * 2]
        return b"t" + struct.pack(">I", len(pairs) // 2) + b"".join(pairs)
    return b"i" + struct.pack(">I", len(items)) + b"".join(items)  # LARGE_TUPLE, at any arity


@st.composite
def requests(draw) -> bytes:
    """A frame in a shape request_fast recognises: {call, ReqId, Method, Args}
    with or without TimeoutMs, and execute_kernel's {KernelId, Input, Hint}."""
    head = atom_bytes(b"call", draw(atom_tags)) + draw(integers())
    timeout = [draw(integers())] if draw(st.booleans()) else []
    if draw(st.booleans()):
        method = atom_bytes(b"execute_kernel", draw(atom_tags))
        hint = draw(st.one_of(integers(), terms_bytes(2)))
        args = small_tuple([binary_bytes(draw(st.binary(min_size=1, max_size=12))), binary_bytes(draw(st.binary(max_size=40))), hint])
    else:
        method = draw(atoms())
        args = any_tuple(draw(children(1)))
    return b"\x83" + small_tuple([head[: head.index(b"call") + 4], head[head.index(b"call") + 4 :], method, args, *timeout])


def same(a, b) -> bool:
    return erlang.term_to_binary(a) == erlang.term_to_binary(b)


def assert_within_the_guard(frame: bytes) -> None:
    """The property: each road that accepts a frame accepts only what the
    guard's walk accepts, and reads from it what erlang-py reads."""
    hot = decode_hot(frame)
    if hot is not None:
        check_frame(frame)
        assert same(hot, erlang.binary_to_term(frame))
    fields = execute_kernel_fields(frame)
    if fields is not None:
        check_frame(frame)
        _, req_id, _, args, timeout = erlang.binary_to_term(frame)
        kernel, data, hint = args[:3]
        usage = len(args) == 4  # the usage form: {KernelId, Input, Hint, usage} (docs/metering.md)
        assert not usage or terms.atom_name(args[3]) == "usage"
        assert fields == (req_id, kernel.value, data.value, hint, timeout, usage)
    try:
        decoded = terms.decode_request(frame)
    except KemError as exc:
        assert exc.reason in ("bad_frame", "too_large")
    else:
        check_frame(frame)
        assert same(decoded, erlang.binary_to_term(frame))


# 64 wide is in bounds, 65 is not; a frame of SMALL_TUPLEs only, as the hot
# decoder reads; 3 x 64 x 64 + ... is past 10,000 terms with every tuple in bounds.
WIDE_TUPLE = b"\x83" + small_tuple([b"a\x01"] * (MAX_ARITY + 1))
MANY_TERMS = b"\x83" + small_tuple([small_tuple([small_tuple([b"a\x01"] * 64)] * 64)] * 3)
LONG_ATOM = b"\x83" + small_tuple([atom_bytes(b"a" * (MAX_ATOM + 1), 100)])


@settings(max_examples=400, deadline=None)
@given(frame=st.one_of(requests(), terms_bytes().map(lambda t: b"\x83" + t)))
@example(frame=WIDE_TUPLE)
@example(frame=MANY_TERMS)
@example(frame=LONG_ATOM)
def test_what_the_hot_decoder_accepts_the_guard_accepts(frame):
    assert_within_the_guard(frame)


def capacity(levels: int) -> int:
    """The most terms a tree of `levels` levels of 64-wide tuples holds."""
    return 1 if levels == 0 else 1 + MAX_ARITY * capacity(levels - 1)


def exactly(nodes: int, levels: int = 3) -> bytes:
    """A tree of SMALL_TUPLEs, none wider than 64, of exactly `nodes` terms."""
    if nodes == 1:
        return b"a\x07"
    items, rest = [], nodes - 1
    while rest:
        take = min(rest, capacity(levels - 1))
        items.append(exactly(take, levels - 1))
        rest -= take
    return small_tuple(items)


def test_each_bound_is_the_guards_to_the_term():
    """At each bound the hot decoder accepts; one past it, it leaves the
    frame to the guard, which refuses it."""
    in_bounds = (b"\x83" + small_tuple([b"a\x01"] * MAX_ARITY), b"\x83" + small_tuple([atom_bytes(b"a" * MAX_ATOM, 100)]),
                 b"\x83" + exactly(MAX_NODES))
    for frame in in_bounds:
        check_frame(frame)
        assert same(decode_hot(frame), erlang.binary_to_term(frame))
    for frame in (WIDE_TUPLE, MANY_TERMS, LONG_ATOM, b"\x83" + exactly(MAX_NODES + 1)):
        assert decode_hot(frame) is None
        with pytest.raises(KemError) as err:
            terms.decode_request(frame)
        assert err.value.reason == "bad_frame"


def nested_tuples_frame(req_id: int, width: int = 255) -> bytes:
    """The issue's attack: execute_kernel's arguments a tree of tuples of
    empty binaries. 255 wide, 13 MB of frame that erlang-py's classes grew
    to 250 MB on the hot road; 64 wide (every tuple in bounds), 1.3 MB
    holding 266,000 terms."""
    level3 = small_tuple([binary_bytes(b"")] * width)
    args = small_tuple([small_tuple([level3] * width)] * (40 if width == 255 else width))
    head = small_tuple([atom_bytes(b"call", 119), integer_bytes(req_id, "small" if req_id < 256 else "int"), atom_bytes(b"execute_kernel", 119), args])
    return b"\x83" + head


@pytest.mark.parametrize("width", [255, MAX_ARITY])
def test_nested_tuples_are_refused_without_building_them(width):
    frame = nested_tuples_frame(77, width)
    tracemalloc.start()
    try:
        with pytest.raises(KemError) as err:
            terms.decode_request(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"{len(frame)}-byte frame refused with a peak of {peak} bytes allocated")
    assert (err.value.reason, err.value.req_id) == ("bad_frame", 77)
    # At most MAX_NODES small objects are built before the count runs out.
    assert peak < 2 * len(frame)


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_nested_tuples_through_the_port_answer_their_caller_and_bystanders(rng):
    with start_port() as port:
        port.call("ping")
        before = peak_rss(port.proc.pid)
        with pytest.raises(PortError) as err:
            port.call_raw(nested_tuples_frame, timeout=60)
        assert err.value.reason == "bad_frame"
        grown = peak_rss(port.proc.pid) - before
        frame_size = len(nested_tuples_frame(1))
        print(f"port's peak memory grew {grown >> 20} MiB for a {frame_size >> 20} MiB frame")
        # The frame is read whole (and sliced once by the reader); anything
        # past ~3x its size would be the terms built from it.
        assert grown < 4 * frame_size
        for size in (1, 300, 4096):
            words = rng.integers(0, 2**32, size, dtype=np.uint32)
            assert port.call("execute_kernel", b"double", words.tobytes(), 1) == (words * np.uint32(2)).tobytes()


@st.composite
def execute_kernel_frames(draw) -> bytes:
    """The node's one hot shape, {call, ReqId, execute_kernel, {K, I, Hint},
    TimeoutMs}, its integers in whichever encoding fits (or not: too wide)."""
    number = lambda: integer_bytes(draw(st.integers(0, (1 << 72) - 1)), draw(integer_forms))  # noqa: E731
    args = small_tuple([binary_bytes(draw(st.binary(min_size=1, max_size=12))), binary_bytes(draw(st.binary(max_size=64))), number()])
    return b"\x83" + small_tuple([atom_bytes(b"call", draw(atom_tags)), number(), atom_bytes(b"execute_kernel", draw(atom_tags)), args, number()])


@settings(max_examples=300, deadline=None)
@given(frame=execute_kernel_frames())
def test_execute_kernel_fields_stay_within_the_guard(frame):
    assert_within_the_guard(frame)


# -- map keys: one key in Erlang is one key here -----------------------------------

# Keys Python's dict may take as equal though Erlang does not (True == 1,
# False == 0, 0 == 0.0 == -0.0), a group per Erlang value with its spellings
# (Erlang refuses a map holding one value twice, so a frame holds one of each).
CLASHING_KEYS = ((b"a\x00",), (b"a\x01", b"b\x00\x00\x00\x01", b"n\x01\x00\x01"), (b"w\x04true", b"s\x04true"),
                 (b"d\x00\x05false",), (b"F" + struct.pack(">d", 0.0),), (b"F" + struct.pack(">d", -0.0),),
                 (b"F" + struct.pack(">d", 1.0),), (b"w\x01x",), (b"m\x00\x00\x00\x01x",), (b"w\x09undefined",))


@st.composite
def distinct_keys(draw) -> list[bytes]:
    groups = draw(st.lists(st.sampled_from(CLASHING_KEYS), min_size=1, max_size=6, unique=True))
    return draw(st.permutations([draw(st.sampled_from(group)) for group in groups]))


@settings(max_examples=300, deadline=None)
@given(keys=distinct_keys())
def test_a_map_either_road_accepts_keeps_every_erlang_key(keys):
    """Red team (tests/test_red_team_run3.py): #{0 => A, false => B} was
    {0: B} on both roads. Whatever a road accepts holds one entry per pair:
    keys that are distinct in Erlang stay distinct, or the frame is refused."""
    frame = b"\x83t" + struct.pack(">I", len(keys)) + b"".join(k + bytes([97, i]) for i, k in enumerate(keys))
    hot = decode_hot(frame)
    assert hot is None or len(hot) == len(keys)
    try:
        decoded = terms.decode_request(frame)
    except KemError as exc:
        assert exc.reason == "bad_frame"
    else:
        assert len(decoded) == len(keys), decoded
