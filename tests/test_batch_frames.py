"""Calls frames and replies frames (kem_port/batch_frames.py): many calls in
one frame, many results in one frame. Against the real port: values vs
numpy, one bad call answering only its caller, timeouts inside a batch, and
hostile calls frames answered without taking the port down."""

from __future__ import annotations

import struct
import time

import erlang
import numpy as np
import pytest

from conftest import sent, start_port, wait_running
from kem_port.wire import batch_frames, terms
from kem_port.client import PortError

CALL = terms.atom("call")


def request(req_id: int, method: str, *args, timeout_ms: int | None = None) -> bytes:
    term: tuple = (CALL, req_id, terms.atom(method), tuple(terms.to_term(a) for a in args))
    return terms.encode(term + ((timeout_ms,) if timeout_ms is not None else ()))


def test_calls_frame_is_the_etf_of_calls_and_binaries(rng):
    frames = [request(int(rng.integers(1, 2**40)), "ping") for _ in range(int(rng.integers(1, 20)))]
    encoded = batch_frames.encode_calls(frames)
    tag, items = erlang.binary_to_term(encoded)
    assert terms.atom_name(tag) == "calls"
    assert [terms.binary_bytes(item) for item in items] == frames
    assert batch_frames.split_calls(encoded) == frames


def test_replies_frame_is_the_etf_of_an_index_and_a_blob(rng):
    results = [(int(rng.integers(0, 2**63)), rng.bytes(int(rng.integers(0, 300)))) for _ in range(int(rng.integers(2, 40)))]
    frame = b"".join(bytes(p) for p in batch_frames.replies_frame(results))
    tag, index, blob = erlang.binary_to_term(frame)
    assert terms.atom_name(tag) == "replies"
    entries = list(struct.iter_unpack(">QI", terms.binary_bytes(index)))
    assert entries == [(req_id, len(data)) for req_id, data in results]
    assert terms.binary_bytes(blob) == b"".join(data for _, data in results)
    assert batch_frames.split_replies(frame) == results


@pytest.mark.parametrize(
    "frame",
    [
        batch_frames.CALLS_HEAD + struct.pack(">I", 2**32 - 1) + b"m\x00\x00\x00\x01\x00j",  # huge count
        batch_frames.CALLS_HEAD + struct.pack(">I", batch_frames.MAX_CALLS + 1) + b"j",
        batch_frames.CALLS_HEAD + struct.pack(">I", 0) + b"j",  # empty
        batch_frames.CALLS_HEAD + struct.pack(">I", 1) + b"m\xff\xff\xff\xff" + b"x" * 10 + b"j",  # item past the end
        batch_frames.CALLS_HEAD + struct.pack(">I", 1) + b"m\x00\x00\x00\x01xj" + b"trailing",
        batch_frames.CALLS_HEAD + struct.pack(">I", 1) + b"h\x01m\x00\x00\x00\x01xj",  # an item that is no binary
        batch_frames.CALLS_HEAD + struct.pack(">I", 2) + b"m\x00\x00\x00\x01x",  # ends early
        batch_frames.CALLS_HEAD,
    ],
)
def test_malformed_calls_frames_are_not_split(frame):
    assert batch_frames.split_calls(frame) is None


def test_replies_frames_that_disagree_are_refused():
    good = b"".join(bytes(p) for p in batch_frames.replies_frame([(1, b"ab"), (2, b"cde")]))
    assert batch_frames.split_replies(good) == [(1, b"ab"), (2, b"cde")]
    assert batch_frames.split_replies(good[:-1]) is None
    assert batch_frames.split_replies(good + b"x") is None


@pytest.mark.parametrize("count", [2, 17, 64])
def test_a_calls_frame_round_trips_values(port, rng, count):
    inputs = [rng.integers(0, 2**31, int(rng.integers(1, 5000)), dtype=np.uint32) for _ in range(count)]
    calls = [("execute_kernel", b"double", x.tobytes(), 1) for x in inputs]
    futures = port.call_batch_async(calls, timeout_ms=60000)
    for x, fut in zip(inputs, futures):
        assert np.array_equal(np.frombuffer(fut.result(60), dtype=np.uint32), x * np.uint32(2))


def test_one_bad_call_in_a_calls_frame_answers_only_its_caller(port, rng):
    x = rng.integers(0, 2**31, 64, dtype=np.uint32)
    good = ("execute_kernel", b"double", x.tobytes(), 1)
    futures = port.call_batch_async([good, ("execute_kernel", b"no_such_kernel", b"abcd", 1), good,
                                     ("execute_kernel", b"double", b"abcd", 0), ("ping",), good])
    for i in (0, 2, 5):
        assert np.array_equal(np.frombuffer(futures[i].result(60), dtype=np.uint32), x * np.uint32(2))
    reasons = []
    for i in (1, 3):
        with pytest.raises(PortError) as err:
            futures[i].result(60)
        reasons.append(err.value.reason)
    assert reasons == ["kernel_not_found", "bad_args"]
    assert terms.atom_name(futures[4].result(60)) == "pong"


def test_refused_terms_inside_a_calls_frame_answer_their_callers(port, rng):
    """A huge integer, a pid, bytes that are not a term: each answers its own
    caller (or no caller); the good calls around them are served."""
    x = rng.integers(0, 2**31, 16, dtype=np.uint32)
    ids = [10_000_001, 10_000_002, 10_000_003, 10_000_004]
    huge = terms.encode((CALL, ids[1], terms.atom("execute_kernel"), (terms.Binary(b"double"), terms.Binary(b"abcd"), 2**200)))
    node = erlang.OtpErlangAtom(b"n@h")
    pid = terms.encode((CALL, ids[2], terms.atom("ping"), (erlang.OtpErlangPid(node, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00", b"\x00"),)))
    frames = [request(ids[0], "execute_kernel", b"double", x.tobytes(), 1), huge, pid, b"\x83junk", request(ids[3], "ping")]
    replies = {}
    with start_port() as client:
        futures = client.call_raw_batch(frames, ids)
        for i, fut in zip(ids, futures):
            try:
                replies[i] = ("ok", fut.result(60))
            except PortError as exc:
                replies[i] = ("error", exc.reason)
        assert np.array_equal(np.frombuffer(replies[ids[0]][1], dtype=np.uint32), x * np.uint32(2))
        assert replies[ids[1]] == ("error", "too_large")
        assert replies[ids[2]] == ("error", "bad_frame")
        assert terms.atom_name(replies[ids[3]][1]) == "pong"
        assert terms.atom_name(client.call("ping")) == "pong"


@pytest.mark.parametrize(
    "junk",
    [
        batch_frames.CALLS_HEAD + struct.pack(">I", 2**32 - 1) + b"m\x00\x00\x00\x01\x00j",
        batch_frames.CALLS_HEAD + struct.pack(">I", 3) + b"m\x00\x00\x00\x05" + b"h" * 5 + b"j",
        batch_frames.CALLS_HEAD + struct.pack(">I", 1) + b"m" + struct.pack(">I", 40) + b"\x83" + b"h\x01" * 19 + b"aj",
        batch_frames.CALLS_HEAD + struct.pack(">I", 200) + (b"m\x00\x00\x00\x02\x83j") * 200 + b"j",
    ],
)
def test_hostile_calls_frames_are_answered_not_crashed(port, junk):
    before = len(port.unmatched)
    port.send_raw(junk)
    assert terms.atom_name(port.call("ping")) == "pong"
    deadline = time.monotonic() + 10
    while len(port.unmatched) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = port.unmatched[before:]
    assert refused, "a hostile frame was not answered"
    for _, req_id, (status, (reason, _)) in refused:
        assert req_id is None and terms.atom_name(status) == "error"
        assert terms.atom_name(reason) in ("bad_frame", "bad_request")


def test_timeouts_inside_a_calls_frame():
    """The GPU is busy: the calls of a frame with a short timeout are answered
    timeout by the port itself, those without one are served after."""
    x = np.arange(32, dtype=np.uint32)
    with start_port() as client:
        # 2 s, running before the frames are sent: they must be read while it
        # holds the GPU, so that the short ones' deadlines pass in the queue.
        busy_id, busy = sent(client, "test_hook", terms.atom("sleep_gpu"), 2000)
        wait_running(client, busy_id)
        call = ("execute_kernel", b"double", x.tobytes(), 1)
        short = client.call_batch_async([call] * 5, timeout_ms=200)
        patient = client.call_batch_async([call] * 5)
        for fut in short:
            with pytest.raises(PortError) as err:
                fut.result(30)
            assert err.value.reason == "timeout"
        for fut in patient:
            assert np.array_equal(np.frombuffer(fut.result(30), dtype=np.uint32), x * 2)
        busy.result(30)


def test_a_calls_frame_over_the_queue_limit_refuses_only_the_extra_calls(rng):
    """The GPU is busy: of a calls frame of 12 calls on a port that queues
    8, the first 8 are served (values vs numpy) and 4 hear overloaded;
    the queue holds nothing afterwards."""
    with start_port(KEM_QUEUE_LIMIT="8") as client:
        client.call_async("test_hook", terms.atom("sleep_gpu"), 800)
        time.sleep(0.2)
        # The sleep must be running, not still queued (it would take one of
        # the 8 places): stats is read after the hook's frame, so an empty
        # queue there means the GPU thread has taken it.
        while client.call_plain("stats")["queue_depth"]:
            time.sleep(0.01)
        inputs = [rng.integers(0, 2**31, int(rng.integers(1, 500)), dtype=np.uint32) for _ in range(12)]
        futures = client.call_batch_async([("execute_kernel", b"double", x.tobytes(), 1) for x in inputs])
        outcomes = []
        for x, fut in zip(inputs, futures):
            try:
                assert np.array_equal(np.frombuffer(fut.result(30), dtype=np.uint32), x * np.uint32(2))
                outcomes.append("ok")
            except PortError as exc:
                outcomes.append(exc.reason)
        assert outcomes == ["ok"] * 8 + ["overloaded"] * 4
        assert client.call("stats")[terms.atom("held_calls")] == 0
