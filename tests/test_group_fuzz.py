"""Hostile group frames (docs/protocol.md, "Group frames") against the real
port on the real adapter: hypothesis mutates valid group frames (truncated,
a length field flipped, N = 0/1/257/huge, Entries not whole entries, Inputs
not N * S, odd hints and kernel ids, repeated ReqIds, trailing bytes, wrong
arity, other ETF spellings, a group inside a calls frame). After each frame: every reply is well formed,
either every ReqId of the frame is answered once or the frame is answered
once to `undefined`, no ReqId is answered twice, the budget is back to
zero, and a plain execute_kernel call still returns numpy's values."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import start_port
from kem_port.wire import group_frames, terms
from kem_port.wire.batch_frames import encode_calls
from kem_port.client import PortError

# What a hostile group may hear ("internal" is not among them: that is a bug).
REASONS = {"bad_request", "bad_frame", "bad_args", "too_large", "overloaded", "kernel_not_found", "invalid_kernel_id",
           "unknown_method", "timeout"}


@pytest.fixture(scope="module")
def fuzz_port():
    with start_port() as client:
        client.call("execute_kernel", b"double", bytes(4), 1)  # admitted: valid groups are one job
        client.call("execute_kernel", b"double_table", bytes(4), 1)  # and of a call-table kernel, one dispatch
        yield client


HINTS = st.one_of(st.sampled_from([1, 1, 2, 0, -1, 2**31 - 1, 2**31, 2**70, -(2**70)]), st.integers(-300, 300))
ODD_HINTS = st.sampled_from([1.0, "atom", "binary", "list"])
KERNEL_IDS = st.sampled_from([b"double", b"double", b"double", b"double_table", b"", b"no such kernel", b"x" * 129, b"double\x00", b"nope_" + b"a" * 20])
COUNTS = st.sampled_from([0, 1, 2, 3, 17, 256, 257, 300])
MUTATIONS = st.sampled_from(["none", "none", "truncate", "flip_length", "trailing", "arity", "atom_ext", "odd_hint",
                             "odd_kernel_id", "entries_ragged", "inputs_ragged", "repeat_req_id"])


def _odd(kind: str):
    return {"atom": terms.atom("one"), "binary": terms.Binary(b"\x01"), "list": [1, 2]}.get(kind, kind)


def _lengths_at(frame: bytes) -> list[int]:
    """Where the node spelling's 32-bit lengths are (KernelId, Entries, Inputs)."""
    pos = len(group_frames.NODE_HEAD)
    found = []
    for field in range(3):
        found.append(pos + 1)
        pos += 5 + struct.unpack_from(">I", frame, pos + 1)[0]
        if field == 0:  # the hint
            tag = frame[pos]
            pos += {97: 2, 98: 5}.get(tag, 3 + (frame[pos + 1] if tag == 110 else 0))
    return found


@st.composite
def hostile_groups(draw, fresh_ids):
    """(frame, the distinct ReqIds it names, whether each of them must hear
    a reply, the inputs when the frame is a valid group)."""
    n, kernel_id, hint = draw(COUNTS), draw(KERNEL_IDS), draw(HINTS)
    words = draw(st.integers(1, 40))
    mutation = draw(MUTATIONS)
    req_ids = fresh_ids(n)
    timeouts = [draw(st.sampled_from([0, 0, 60000, 2**32 - 1])) for _ in req_ids]
    seed = draw(st.integers(0, 2**32 - 1))
    inputs = [np.random.default_rng(seed + i).integers(0, 2**31, words, dtype=np.uint32).tobytes() for i in range(n)]
    entries = list(zip(req_ids, timeouts))
    if mutation == "repeat_req_id" and n >= 2:
        entries[-1] = (req_ids[0], 0)
        req_ids = req_ids[:-1]
    named = True
    if mutation in ("arity", "atom_ext", "odd_hint", "odd_kernel_id", "entries_ragged", "inputs_ragged"):
        packed = b"".join(group_frames.ENTRY.pack(*e) for e in entries)
        blob = b"".join(inputs)
        fields = [terms.atom("group"), terms.Binary(kernel_id), hint, terms.Binary(packed), terms.Binary(blob)]
        if mutation == "odd_hint":
            fields[2] = _odd(draw(ODD_HINTS))
        elif mutation == "odd_kernel_id":
            fields[1] = draw(st.sampled_from([7, terms.atom("double"), [100, 111], "double"]))
        elif mutation == "entries_ragged":
            fields[3] = terms.Binary(packed + b"\x00" * draw(st.integers(1, 11)))
            named = False
        elif mutation == "inputs_ragged":
            fields[4] = terms.Binary(blob + b"\x01" * draw(st.integers(1, 3)))
        elif mutation == "arity":
            fields = fields[:4] if draw(st.booleans()) else fields + [terms.Binary(b"")]
            named = False
        frame = terms.encode(tuple(fields))
        if abs(hint) >= 2**63 and mutation != "odd_hint":
            # Not the node's spelling, so read by the general decoder, whose
            # guard refuses integers over 8 bytes before it sees a group: too_large to undefined.
            named = False
        if mutation == "atom_ext":
            frame = bytes([131, 104, 5, 100, 0, 5]) + b"group" + frame[len(group_frames.NODE_HEAD):] if frame.startswith(group_frames.NODE_HEAD) else frame
        return frame, req_ids, named, None
    frame = group_frames.encode_group(kernel_id, hint, entries, inputs)
    if mutation == "truncate":
        frame, named = frame[: draw(st.integers(0, len(frame) - 1))], False
    elif mutation == "flip_length":
        at = draw(st.sampled_from(_lengths_at(frame)))
        value = draw(st.sampled_from([0, 1, 11, 12, 2**31, 2**32 - 1])) if draw(st.booleans()) else struct.unpack_from(">I", frame, at)[0] ^ (1 << draw(st.integers(0, 31)))
        frame, named = frame[:at] + struct.pack(">I", value) + frame[at + 4 :], False
    elif mutation == "trailing":
        frame, named = frame + draw(st.binary(min_size=1, max_size=20)), False
    if draw(st.integers(0, 5)) == 0:  # as an item of a calls frame (a valid term, not what the node sends)
        frame = encode_calls([frame])
    valid = mutation in ("none", "repeat_req_id") and kernel_id in (b"double", b"double_table") and hint == 1 and 2 <= n <= 256 and mutation == "none"
    return frame, req_ids, named, (inputs if valid else None)


def _result(fut) -> tuple[str, object]:
    try:
        return "ok", fut.result(0)
    except PortError as exc:
        return "error", exc.reason


def _wait(predicate, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_hostile_group_frames_leave_the_port_serving(fuzz_port, data):
    port = fuzz_port
    frame, req_ids, named, inputs = data.draw(hostile_groups(port.next_req_ids))
    unmatched_before = len(port.unmatched)
    futures = port.call_raw_frame(frame, req_ids)

    # The port still serves a plain call, with numpy's values.
    x = np.random.default_rng(len(frame)).integers(0, 2**31, int(np.random.default_rng().integers(1, 500)), dtype=np.uint32)
    assert np.array_equal(np.frombuffer(port.call("execute_kernel", b"double", x.tobytes(), 1), np.uint32), x * np.uint32(2))

    def answered() -> bool:
        done = sum(f.done() for f in futures)
        return done == len(futures) or (done == 0 and len(port.unmatched) > unmatched_before)

    assert _wait(answered), f"frame {frame[:60]!r}: {sum(f.done() for f in futures)}/{len(futures)} answered"
    time.sleep(0.01)  # a late second reply to the same ReqId would land in unmatched
    late = port.unmatched[unmatched_before:]
    done = [f for f in futures if f.done()]
    if named and req_ids:
        assert len(done) == len(futures) and not late, f"not every ReqId answered once: {frame[:60]!r}"
    if done:
        assert len(done) == len(futures) and not late, "both callers and undefined answered"
    else:
        assert len(late) == 1, f"an unreadable frame answered {len(late)} times"
        _, req_id, (status, (reason, _)) = late[0]
        assert req_id is None and terms.atom_name(status) == "error" and terms.atom_name(reason) in REASONS
    results = [_result(f) for f in done]
    for status, value in results:
        assert status == "ok" or value in REASONS, value
    if inputs is not None:
        for data_in, (status, value) in zip(inputs, results):
            assert status == "ok" and value == (np.frombuffer(data_in, np.uint32) * np.uint32(2)).tobytes()
    assert _wait(lambda: port.call_plain("stats")["held_calls"] == 0, 10), "the budget was not given back"
    assert port.call_plain("stats").get("held_bytes", 0) == 0
