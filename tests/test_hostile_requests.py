"""Hostile requests (issue 13, item 3): frames whose integers, lists or
nesting exceed what kem's requests hold are refused before erlang-py builds
them, in time linear in the frame, and the caller and bystanders are answered."""

from __future__ import annotations

import time

import erlang
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import start_port
from kem_port.wire import terms
from kem_port.client import PortError
from kem_port.errors import KemError
from kem_port.wire.etf_guard import check_frame, peek_req_id
from kem_port.wire.request_fast import decode_hot


def call_frame(req_id: int, method: str, *args) -> bytes:
    return terms.encode((terms.atom("call"), req_id, terms.atom(method), tuple(args)))


def big_integer(digits: int) -> bytes:
    """ETF of a positive integer of about `digits` decimal digits, as the
    node's term_to_binary writes it (built here directly: Python's own int
    conversions stop at 4,300 digits)."""
    size = max(1, int(digits / 2.408))  # 2.408 decimal digits per byte
    return b"o" + size.to_bytes(4, "big") + b"\x00" + b"\xff" * size


def huge_hint_frame(req_id: int, digits: int) -> bytes:
    head = call_frame(req_id, "execute", terms.Binary(b"double"), terms.Binary(b"abcd"), {terms.atom("output_size_hint"): 0})
    assert head.endswith(b"a\x00")  # the hint, last: swap in the big one
    return head[:-2] + big_integer(digits)


def refusal(frame: bytes) -> KemError:
    with pytest.raises(KemError) as err:
        terms.decode_request(frame)
    return err.value


def test_kem_requests_pass_the_guard():
    frames = [
        call_frame(2**64 - 1, "execute", terms.Binary(b"double"), terms.Binary(bytes(1000)),
                   {terms.atom("workgroups"): (1, 2, 3), terms.atom("output_size_hint"): 4,
                    terms.atom("params"): terms.Binary(b"\0" * 16), terms.atom("entry_point"): terms.atom("main")}),
        call_frame(0, "ping"),
        call_frame(7, "execute_kernel", terms.Binary(b"x"), terms.Binary(b"ab"), -(2**63)),
    ]
    for frame in frames:
        assert terms.decode_request(frame) == erlang.binary_to_term(frame)


@pytest.mark.parametrize("digits", [30, 4300, 100_000, 1_000_000])
def test_huge_integers_are_too_large_at_once_and_name_their_caller(digits):
    frame = huge_hint_frame(41, digits)
    started = time.perf_counter()
    error = refusal(frame)
    elapsed = time.perf_counter() - started
    print(f"{len(frame)}-byte frame with a {digits}-digit integer refused in {elapsed * 1e6:.0f} us")
    assert error.reason == "too_large"
    assert error.req_id == 41


def test_long_lists_and_deep_nesting_are_bad_frames():
    long_list = terms.encode((terms.atom("call"), 3, terms.atom("execute"), (list(range(250_000)),)))
    assert len(long_list) > 1_000_000
    started = time.perf_counter()
    assert refusal(long_list).reason == "bad_frame"
    print(f"1 MB list frame refused in {(time.perf_counter() - started) * 1e6:.0f} us")
    deep = b"\x83" + b"h\x01" * 17 + b"j"
    assert refusal(deep).reason == "bad_frame"
    terms.decode_request(terms.encode(tuple([(1, 2)] * 60)))  # within bounds
    wide = terms.encode([(1, 2, 3)] * 4000)
    assert refusal(wide).reason == "bad_frame"  # 16,001 terms


@pytest.mark.parametrize(
    "payload",
    [
        b"\x83X" + bytes(30),  # pid
        b"\x83Z\x00\x03" + bytes(30),  # reference
        b"\x83q" + bytes(30),  # export
        b"\x83w\x04call\xff",  # truncated
        b"\x83t\xff\xff\xff\xff",  # map of 2^32 pairs
        b"\x83o\xff\xff\xff\xff\x00",  # 4 GiB bignum
    ],
)
def test_terms_kem_never_uses_are_refused(payload):
    assert refusal(payload).reason in ("bad_frame", "too_large")


def test_the_walk_refuses_atoms_erlang_could_not_make():
    frame = b"\x83d\x01\x00" + b"a" * 256
    with pytest.raises(KemError) as err:
        check_frame(frame)
    assert err.value.reason == "bad_frame"
    # The hot decoder leaves it to the walk (issue 24: its bounds are the walk's).
    assert decode_hot(frame) is None and refusal(frame).reason == "bad_frame"


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_guarded_decode_raises_only_kem_errors(data):
    try:
        terms.decode_request(data)
    except KemError as exc:
        assert exc.reason in ("bad_frame", "too_large")


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=50).map(terms.Binary),
                    lambda c: st.lists(c, max_size=5).map(tuple) | st.lists(c, max_size=5), max_leaves=40))
def test_guard_accepts_what_fits_and_agrees_with_the_library(term):
    frame = terms.encode(term)
    check_frame(frame)
    assert terms.decode_request(frame) == term


def test_peek_req_id_reads_only_a_call_head():
    assert peek_req_id(call_frame(5, "ping")) == 5
    assert peek_req_id(call_frame(2**40 + 3, "ping")) == 2**40 + 3
    assert peek_req_id(terms.encode((1, 2, 3))) is None
    # The node sends each call's timeout as a fifth element (docs/protocol.md).
    with_timeout = terms.encode((terms.atom("call"), 7, terms.atom("chain"), (2**70,), 5000))
    assert peek_req_id(with_timeout) == 7
    assert peek_req_id(b"\x83") is None


def test_huge_hint_through_the_port_is_too_large_and_bystanders_are_served(rng):
    with start_port() as port:
        words = rng.integers(0, 2**32, 1024, dtype=np.uint32)
        data = words.tobytes()
        port.call("ping")  # the port is up: what follows times the refusal only
        for digits in (4300, 1_000_000):
            started = time.perf_counter()
            with pytest.raises(PortError) as err:
                port.call_raw(lambda req_id: huge_hint_frame(req_id, digits))
            print(f"{digits}-digit hint answered in {(time.perf_counter() - started) * 1e3:.1f} ms")
            assert err.value.reason == "too_large"
            expected = (words * np.uint32(2)).tobytes()
            assert port.call("execute_kernel", b"double", data, 1) == expected


def test_an_oversized_frame_is_answered_to_its_caller(rng):
    with start_port(KEM_MAX_INPUT_BYTES="4096") as port:
        big = lambda req_id: call_frame(req_id, "execute_kernel", terms.Binary(b"double"), terms.Binary(bytes(1 << 20)), 1)
        with pytest.raises(PortError) as err:
            port.call_raw(big, timeout=30)
        assert err.value.reason == "too_large"
        words = rng.integers(0, 2**32, 1024, dtype=np.uint32)
        assert port.call("execute_kernel", b"double", words.tobytes(), 1) == (words * np.uint32(2)).tobytes()


def test_a_refused_term_in_a_call_is_answered_to_its_caller():
    """kem_port.erl writes the head {call, ReqId, Method, _} itself; a caller
    of kem_port:call/4 can put a pid, ref or fun in the arguments. Such a
    frame is refused (bad_frame) to that caller, not left to its timeout
    (which cost a restart of the port under its bystanders)."""
    pid = erlang.OtpErlangPid(erlang.OtpErlangAtom(b"nonode@nohost"), b"\0\0\0\1", b"\0\0\0\0", b"\0")
    frame = call_frame(9, "execute", pid, terms.Binary(b"ab"))
    error = refusal(frame)
    assert (error.reason, error.req_id) == ("bad_frame", 9)
    assert refusal(b"\x83h\x02a\x01").req_id is None  # no call head: no caller to name
    with start_port() as port:
        port.call("ping")
        started = time.perf_counter()
        with pytest.raises(PortError) as err:
            port.call_raw(lambda req_id: call_frame(req_id, "execute", pid, terms.Binary(b"ab")), timeout=30)
        assert err.value.reason == "bad_frame"
        assert time.perf_counter() - started < 10
        assert port.call("ping") == terms.atom("pong")
