"""The straight-off-the-bytes reading of ``{call, ReqId, execute_kernel,
{KernelId, Input, Hint}, TimeoutMs}`` (request_fast.hot_execute_kernel) gives
exactly the call the general road (decode_request, parse_call, kernel_call)
gives, and leaves every frame it does not accept -- a broken limit, a
truncated or padded frame, another shape -- to that road, which answers it."""

from __future__ import annotations

import erlang
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kem_port.wire import terms
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.wire.protocol import RequestError, kernel_call, parse_call
from kem_port.wire.request_fast import hot_execute_kernel
from kem_port.wire.request_fast import execute_kernel_fields

CONFIG = Config(max_input_bytes=4096, max_output_bytes=16384)
kernel_ids = st.one_of(st.binary(min_size=0, max_size=140), st.from_regex(rb"[A-Za-z0-9_-]{1,128}", fullmatch=True))
integers = st.one_of(st.integers(0, 255), st.integers(0, 2**31 - 1), st.integers(0, 2**64 + 5), st.integers(-(2**40), -1))


def frame_of(req_id: int, kernel: bytes, data: bytes, hint: int, timeout: int | None, atom_tag: int | None = None) -> bytes:
    call = (terms.atom("call"), req_id, terms.atom("execute_kernel"), (terms.Binary(kernel), terms.Binary(data), hint))
    frame = erlang.term_to_binary(call + ((timeout,) if timeout is not None else ()))
    if atom_tag == 100:  # as OTP 25 writes atoms: ATOM_EXT
        frame = frame.replace(b"w\x04call", b"d\x00\x04call", 1).replace(b"w\x0eexecute_kernel", b"d\x00\x0eexecute_kernel", 1)
    return frame


def general(frame: bytes):
    """What the general road makes of frame: (ReqId, KernelCall, timeout_s) or the error."""
    try:
        call = parse_call(terms.decode_request(frame))
        return call.req_id, kernel_call(call.method, call.args, CONFIG), call.timeout_s
    except (KemError, RequestError) as exc:
        return exc


@settings(max_examples=400, deadline=None)
@given(req_id=integers, kernel=kernel_ids, data=st.binary(max_size=5000), hint=integers, timeout=st.one_of(st.none(), integers),
       atom_tag=st.sampled_from([None, 100]))
def test_hot_reading_is_the_general_reading_or_none(req_id, kernel, data, hint, timeout, atom_tag):
    frame = frame_of(req_id, kernel, data, hint, timeout, atom_tag)
    hot = hot_execute_kernel(frame, CONFIG)
    want = general(frame)
    if hot is None:
        return  # the general road answers it (an error, a 4-tuple without timeout, or a valid call)
    assert not isinstance(want, Exception), f"hot path accepted what the general road refuses: {want}"
    req_id_hot, call, deadline, timeout_s, is_hot = hot
    assert (req_id_hot, call, timeout_s) == want and is_hot is True
    assert deadline > 0


@settings(max_examples=200, deadline=None)
@given(req_id=st.integers(0, 2**64 - 1), kernel=st.from_regex(rb"[A-Za-z0-9_-]{1,128}", fullmatch=True),
       data=st.binary(max_size=4096), hint=st.integers(1, 4), timeout=st.integers(1, 2**64 - 1), atom_tag=st.sampled_from([None, 100]))
def test_valid_calls_take_the_hot_path(req_id, kernel, data, hint, timeout, atom_tag):
    frame = frame_of(req_id, kernel, data, hint, timeout, atom_tag)
    hot = hot_execute_kernel(frame, CONFIG)
    assert hot is not None
    assert hot[0] == req_id and hot[1].input == data and hot[1].output_size == len(data) * hint
    # / 1000.0 as the port divides (the int converted first): 9_999_999_999_999_999 / 1000 is exact in Python
    assert hot[1].kernel_id == kernel.decode() and hot[3] == timeout / 1000.0


def test_node_bytes_take_the_hot_path():
    # term_to_binary({call, 300, execute_kernel, {<<"double">>, <<"abcd">>, 1}, 60000}) from OTP 25
    frame = bytes([131, 104, 5, 100, 0, 4, 99, 97, 108, 108, 98, 0, 0, 1, 44, 100, 0, 14]) + b"execute_kernel" + bytes(
        [104, 3, 109, 0, 0, 0, 6]) + b"double" + bytes([109, 0, 0, 0, 4]) + b"abcd" + bytes([97, 1, 98, 0, 0, 234, 96])
    req_id, call, _, timeout_s, hot = hot_execute_kernel(frame, CONFIG)
    assert hot is True
    assert (req_id, call.kernel_id, call.input, call.output_size, timeout_s) == (300, "double", b"abcd", 4, 60.0)


@pytest.mark.parametrize("cut", [1, 5, 12, 30, 40])
def test_truncated_or_padded_frames_fall_through(cut):
    frame = frame_of(7, b"double", b"\x01\x02\x03\x04", 1, 5000)
    assert execute_kernel_fields(frame) is not None
    assert execute_kernel_fields(frame[:-cut]) is None
    assert execute_kernel_fields(frame + b"\x00" * cut) is None


@pytest.mark.parametrize("kernel, data, hint, why", [
    (b"double", b"\0" * 4097, 1, "input over KEM_MAX_INPUT_BYTES"),
    (b"double", b"\0" * 4096, 5, "output over KEM_MAX_OUTPUT_BYTES"),
    (b"double", b"", 16385, "hint over KEM_MAX_OUTPUT_BYTES"),
    (b"double", b"\0" * 4, 0, "hint not > 0"),
    (b"dou/ble", b"\0" * 4, 1, "kernel id characters"),
    (b"", b"\0" * 4, 1, "empty kernel id"),
    (b"d" * 129, b"\0" * 4, 1, "kernel id too long"),
])
def test_a_broken_limit_is_left_to_the_general_road(kernel, data, hint, why):
    frame = frame_of(9, kernel, data, hint, 5000)
    assert hot_execute_kernel(frame, CONFIG) is None, why
    assert isinstance(general(frame), Exception), why
