"""Group frames (kem_port/group_frames.py): N calls to one kernel with one
input size and hint in one frame. Against the real port on the real
adapter: values vs numpy, per-call timeouts, per-ReqId refusals, call_state,
the work budget, size limits, and malformed frames answered without taking
the port down."""

from __future__ import annotations

import struct
import time

import erlang
import numpy as np
import pytest

from conftest import sent, start_port, wait_running
from kem_port.wire import group_frames, terms
from kem_port.client import PortError
from kem_port.config import Config


def outcome(fut, timeout: float = 60) -> tuple[str, object]:
    try:
        return "ok", fut.result(timeout)
    except PortError as exc:
        return "error", exc.reason


def random_inputs(rng, n: int, words: int) -> list[np.ndarray]:
    return [rng.integers(0, 2**31, words, dtype=np.uint32) for _ in range(n)]


def test_group_frame_is_the_etf_of_the_group_term(rng):
    inputs = [rng.bytes(12) for _ in range(3)]
    entries = [(int(rng.integers(0, 2**63)), int(rng.integers(0, 2**32))) for _ in inputs]
    frame = group_frames.encode_group(b"double", 300, entries, inputs)
    tag, kernel_id, hint, packed, blob = erlang.binary_to_term(frame)
    assert terms.atom_name(tag) == "group" and terms.binary_bytes(kernel_id) == b"double" and hint == 300
    assert list(struct.iter_unpack(">QI", terms.binary_bytes(packed))) == entries
    assert terms.binary_bytes(blob) == b"".join(inputs)
    fields = group_frames.read_fields(frame)
    assert fields is not None and (fields.kernel_id, fields.hint, fields.entries) == (b"double", 300, terms.binary_bytes(packed))
    assert bytes(fields.inputs) == b"".join(inputs)
    assert group_frames.read_fields(frame + b"x") is None and group_frames.read_fields(frame[:-1]) is None


@pytest.mark.parametrize("n,words", [(2, 1), (17, 333), (64, 16), (256, 3)])
def test_a_group_round_trips_values(port, rng, n, words):
    inputs = random_inputs(rng, n, words)
    futures = port.call_group_async(b"double", [x.tobytes() for x in inputs], timeouts_ms=60000)
    for x, fut in zip(inputs, futures):
        assert np.array_equal(np.frombuffer(fut.result(60), dtype=np.uint32), x * np.uint32(2))


def test_a_group_with_a_hint_and_no_timeouts(port, rng):
    """Hint 2 on a kernel writing one word per input word: the output is the
    input's size times 2, its second half zeros, as a single call's is."""
    inputs = random_inputs(rng, 5, int(rng.integers(1, 200)))
    futures = port.call_group_async(b"double", [x.tobytes() for x in inputs], hint=2)
    for x, fut in zip(inputs, futures):
        alone = port.call("execute_kernel", b"double", x.tobytes(), 2)
        got = fut.result(60)
        assert got == alone and len(got) == 2 * x.nbytes
        assert np.array_equal(np.frombuffer(got, dtype=np.uint32)[: len(x)], x * np.uint32(2))


def test_other_spellings_of_the_group_term_are_read(port, rng):
    """erlang-py's term_to_binary (SMALL_ATOM_EXT), ATOM_EXT, a 5-tuple as
    LARGE_TUPLE_EXT, a hint as a big integer: same answers."""
    inputs = random_inputs(rng, 3, 7)
    body = None
    for spelling in ("library", "atom_ext", "large_tuple"):
        req_ids = port.next_req_ids(3)
        entries = terms.Binary(b"".join(group_frames.ENTRY.pack(r, 0) for r in req_ids))
        term = (erlang.OtpErlangAtom(b"group"), terms.Binary(b"double"), 1, entries, terms.Binary(b"".join(x.tobytes() for x in inputs)))
        frame = erlang.term_to_binary(term)
        assert frame[:4] == bytes([131, 104, 5, 115])  # SMALL_ATOM_EXT
        body = frame[4 + 1 + 5 :]
        if spelling == "atom_ext":
            frame = bytes([131, 104, 5, 100, 0, 5]) + b"group" + body
        elif spelling == "large_tuple":
            frame = bytes([131, 105, 0, 0, 0, 5, 119, 5]) + b"group" + body
        for fut, x in zip(port.call_raw_frame(frame, req_ids), inputs):
            assert np.array_equal(np.frombuffer(fut.result(60), dtype=np.uint32), x * np.uint32(2)), spelling
    big_hint = group_frames.encode_group(b"double", 1, [(r, 0) for r in port.next_req_ids(2)], [b"abcd"] * 2)
    head = len(group_frames.NODE_HEAD) + 5 + len(b"double")
    big_hint = big_hint[:head] + bytes([110, 1, 0, 1]) + big_hint[head + 2 :]
    req_ids = [r for r, _ in struct.iter_unpack(">QI", group_frames.read_fields(big_hint).entries)]
    for fut in port.call_raw_frame(big_hint, req_ids):
        assert np.frombuffer(fut.result(60), dtype=np.uint32)[0] == 2 * int.from_bytes(b"abcd", "little") % 2**32


@pytest.mark.parametrize(
    "kernel_id,hint,words,reason",
    [
        (b"no_such_kernel", 1, 4, "kernel_not_found"),
        (b"bad id!", 1, 4, "invalid_kernel_id"),
        (b"double", 0, 4, "bad_args"),
        (b"double", -3, 4, "bad_args"),
        (b"double", 2**70, 4, "too_large"),
    ],
)
def test_a_refusal_reaches_every_caller_of_the_group(port, kernel_id, hint, words, reason):
    """What one call would hear alone, each ReqId of the group hears."""
    req_ids = port.next_req_ids(4)
    frame = group_frames.encode_group(kernel_id, hint, [(r, 0) for r in req_ids], [bytes(4 * words)] * 4)
    alone = outcome(port.call_async("execute_kernel", kernel_id, bytes(4 * words), hint))
    assert [outcome(f) for f in port.call_raw_frame(frame, req_ids)] == [alone] * 4 == [("error", reason)] * 4
    assert terms.atom_name(port.call("ping")) == "pong"


def test_an_input_over_the_limits_is_too_large_for_every_caller():
    with start_port(KEM_MAX_INPUT_BYTES="4096", KEM_MAX_OUTPUT_BYTES="8192") as client:
        big_input = client.call_group_async(b"double", [bytes(8192)] * 3)
        big_output = client.call_group_async(b"double", [bytes(4096)] * 3, hint=4)
        assert [outcome(f) for f in big_input + big_output] == [("error", "too_large")] * 6
        assert terms.atom_name(client.call("ping")) == "pong"


def _entries(req_ids: list[int]) -> bytes:
    return b"".join(group_frames.ENTRY.pack(r, 0) for r in req_ids)


def _group_term_frame(kernel_id, hint, entries, inputs) -> bytes:
    return terms.encode((terms.atom("group"), kernel_id, hint, entries, inputs))


def malformed_cases(req_ids: list[int]) -> list[tuple[bytes, list[int]]]:
    """(frame, the ReqIds it must answer bad_request)."""
    four = req_ids[:4]
    ok = lambda ids: _entries(ids)  # noqa: E731
    return [
        (group_frames.encode_group(b"double", 1, [(req_ids[0], 0)], [b"abcd"]), req_ids[:1]),  # N = 1
        (group_frames.encode_group(b"double", 1, [(r, 0) for r in req_ids[:257]], [b"abcd"] * 257), req_ids[:257]),
        (group_frames.encode_group(b"double", 1, [(four[0], 0), (four[1], 0), (four[0], 0)], [b"abcd"] * 3), four[:2]),
        (group_frames.encode_group(b"double", 1, [(r, 0) for r in four], [b"abcd"] * 3 + [b"ab"]), four),  # not N * S
        (_group_term_frame(terms.Binary(b"double"), 1, terms.Binary(ok(four)), terms.Binary(b"")), four),  # S = 0
        (_group_term_frame(7, 1, terms.Binary(ok(four)), terms.Binary(bytes(16))), four),  # KernelId no binary
        (_group_term_frame(terms.Binary(b"double"), terms.atom("one"), terms.Binary(ok(four)), terms.Binary(bytes(16))), four),
        (_group_term_frame(terms.Binary(b"double"), 1.0, terms.Binary(ok(four)), terms.Binary(bytes(16))), four),
        (_group_term_frame(terms.Binary(b"double"), 1, terms.Binary(ok(four)), [1, 2, 3]), four),  # Inputs no binary
    ]


def test_malformed_groups_answer_every_caller_bad_request(port):
    req_ids = port.next_req_ids(300)
    for frame, named in malformed_cases(req_ids):
        futures = port.call_raw_frame(frame, named)
        assert [outcome(f) for f in futures] == [("error", "bad_request")] * len(named), frame[:40]
    assert terms.atom_name(port.call("ping")) == "pong"


def refused_undefined(client, frame: bytes) -> list[str]:
    """Send `frame`; once the port still answers ping, the reasons of the
    replies to ReqId undefined it drew (each an error)."""
    before = len(client.unmatched)
    client.send_raw(frame)
    assert terms.atom_name(client.call("ping")) == "pong"
    deadline = time.monotonic() + 10
    while len(client.unmatched) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    reasons = []
    for _, req_id, (status, (reason, _)) in client.unmatched[before:]:
        assert req_id is None and terms.atom_name(status) == "error"
        reasons.append(terms.atom_name(reason))
    return reasons


@pytest.mark.parametrize(
    "junk",
    [
        group_frames.NODE_HEAD + b"m\x00\x00\x00\x06doublea\x01m\x00\x00\x00\x05abcdem\x00\x00\x00\x04abcd",  # Entries of 5 bytes
        group_frames.NODE_HEAD + b"m\x00\x00\x00\x06doublea\x01m\xff\xff\xff\xff",  # ends early
        group_frames.NODE_HEAD,
        group_frames.NODE_HEAD + b"a\x01" * 4,
        _group_term_frame(terms.Binary(b"double"), 1, 12345, terms.Binary(b"abcd")),  # Entries no binary
    ],
)
def test_unreadable_group_frames_answer_undefined(port, junk):
    refused = refused_undefined(port, junk)
    assert len(refused) == 1, "an unreadable group frame was not answered once"
    assert refused[0] in ("bad_frame", "bad_request")


@pytest.mark.parametrize("warm", [True, False], ids=["one_group_job", "calls_on_their_own"])
def test_each_call_keeps_its_own_timeout(warm):
    """The GPU is busy: the group's calls with a short timeout are answered
    timeout by the port itself, those with none (0) or a long one are served.
    Warm: the kernel is admitted and the group is one job whose expired
    slots are skipped; cold: each call waits for admission on its own."""
    x = np.arange(32, dtype=np.uint32)
    with start_port() as client:
        if warm:
            client.call("execute_kernel", b"double", x.tobytes(), 1)
        # 2 s, running before the group is sent: it must be read while the
        # hook holds the GPU, so that the short deadlines pass in the queue.
        busy_id, busy = sent(client, "test_hook", terms.atom("sleep_gpu"), 2000)
        wait_running(client, busy_id)
        timeouts = [200, 0, 200, 60000, 0, 200]
        futures = client.call_group_async(b"double", [x.tobytes()] * 6, timeouts_ms=timeouts)
        got = [outcome(f, 30) for f in futures]
        for timeout_ms, (status, value) in zip(timeouts, got):
            if timeout_ms == 200:
                assert (status, value) == ("error", "timeout")
            else:
                assert status == "ok" and np.array_equal(np.frombuffer(value, dtype=np.uint32), x * 2)
        busy.result(30)
        stats = client.call_plain("stats")
        assert stats["held_calls"] == 0 and stats.get("group_jobs", 0) == (1 if warm else 0)


def test_call_state_answers_for_every_caller_of_a_group():
    x = np.arange(8, dtype=np.uint32)
    with start_port() as client:
        client.call("execute_kernel", b"double", x.tobytes(), 1)  # admitted and compiled: the group queues
        busy_id, busy = sent(client, "test_hook", terms.atom("sleep_gpu"), 1500)
        wait_running(client, busy_id)
        req_ids = client.next_req_ids(4)
        futures = client.call_raw_frame(group_frames.encode_group(b"double", 1, [(r, 0) for r in req_ids], [x.tobytes()] * 4), req_ids)
        states = [client.call_plain("call_state", r)["state"] for r in req_ids]
        assert states == ["queued"] * 4
        for fut in futures:
            assert np.array_equal(np.frombuffer(fut.result(30), dtype=np.uint32), x * 2)
        # Answered: the port forgets them (the GPU thread's bookkeeping may trail the replies a moment).
        deadline = time.monotonic() + 10
        while (states := [client.call_plain("call_state", r)["state"] for r in req_ids]) != ["unknown"] * 4:
            assert time.monotonic() < deadline, states
            time.sleep(0.01)
        busy.result(30)


def test_a_group_over_the_budget_is_refused_as_a_whole(rng):
    """The GPU is busy on a port that holds 8 calls: a group of 12 is
    overloaded for all 12 (it takes its budget at once), a group of 6 after
    it is served (values vs numpy); nothing is held afterwards."""
    with start_port(KEM_QUEUE_LIMIT="8") as client:
        client.call("execute_kernel", b"double", bytes(4), 1)  # admitted: the group of 6 is one job
        busy = client.call_async("test_hook", terms.atom("sleep_gpu"), 800)
        time.sleep(0.2)
        too_many = client.call_group_async(b"double", [bytes(16)] * 12)
        inputs = random_inputs(rng, 6, int(rng.integers(1, 300)))
        fits = client.call_group_async(b"double", [x.tobytes() for x in inputs])
        assert [outcome(f, 30) for f in too_many] == [("error", "overloaded")] * 12
        for x, fut in zip(inputs, fits):
            assert np.array_equal(np.frombuffer(fut.result(30), dtype=np.uint32), x * np.uint32(2))
        busy.result(30)
        assert client.call("stats")[terms.atom("held_calls")] == 0


def test_group_frames_may_be_as_large_as_calls_frames(rng):
    """With small single frames (KEM_MAX_INPUT_BYTES 16 KiB: frames up to
    ~145 KiB), a 1 MiB group of 16 KiB inputs is served; a group over 2 MiB
    is too_large to each of its callers, and the port goes on."""
    with start_port(KEM_MAX_INPUT_BYTES=str(16 << 10)) as client:
        inputs = random_inputs(rng, 64, 4096)
        req_ids = client.next_req_ids(64)
        frame = group_frames.encode_group(b"double", 1, [(r, 0) for r in req_ids], [x.tobytes() for x in inputs])
        assert len(frame) > 4 * Config(max_input_bytes=16 << 10).max_frame_bytes
        for x, fut in zip(inputs, client.call_raw_frame(frame, req_ids)):
            assert np.array_equal(np.frombuffer(fut.result(60), dtype=np.uint32), x * np.uint32(2))
        huge = client.call_group_async(b"double", [bytes(16 << 10)] * 140)  # 2.2 MiB
        assert [outcome(f) for f in huge] == [("error", "too_large")] * 140
        assert terms.atom_name(client.call("ping")) == "pong"


def test_the_echo_port_answers_group_frames(rng):
    """tools/echo_port.py, the benchmark's no-GPU baseline, answers each call
    of a group with its own input, in one replies frame as the port does."""
    from pathlib import Path

    from kem_port.client import PortClient

    script = str(Path(__file__).resolve().parents[1] / "tools" / "echo_port.py")
    inputs = [rng.bytes(int(rng.integers(1, 100)))] * 2 + [rng.bytes(40) for _ in range(30)]
    with PortClient(script=script) as echo:
        for group in (inputs[:2], inputs[2:]):
            assert [f.result(30) for f in echo.call_group_async(b"double", group)] == group


def test_a_warm_group_is_one_job_and_matches_single_calls(port, rng):
    """Once the kernel is admitted a group runs as ONE job of N slots: its
    values are numpy's and the single calls' on the same inputs, with
    outputs larger than inputs (hint 3: zeros past each input, from pooled
    buffers that held other bytes)."""
    words = int(rng.integers(1, 600))
    inputs = random_inputs(rng, 33, words)
    port.call("execute_kernel", b"double", inputs[0].tobytes(), 3)
    before = port.call_plain("stats")["group_jobs"] if "group_jobs" in port.call_plain("stats") else 0
    got = [f.result(60) for f in port.call_group_async(b"double", [x.tobytes() for x in inputs], hint=3, timeouts_ms=60000)]
    assert port.call_plain("stats")["group_jobs"] == before + 1
    for x, out in zip(inputs, got):
        want = np.concatenate([x * np.uint32(2), np.zeros(2 * words, np.uint32)])
        assert np.array_equal(np.frombuffer(out, dtype=np.uint32), want)
    assert got[5] == port.call("execute_kernel", b"double", inputs[5].tobytes(), 3)


def test_a_group_to_a_call_table_kernel(port, rng):
    """double_table lays out its own calls (docs/dispatch.md): a group's
    slots run as its plain calls, each value numpy's."""
    port.call("execute_kernel", b"double_table", bytes(8), 1)
    inputs = random_inputs(rng, 20, int(rng.integers(1, 100)))
    for x, fut in zip(inputs, port.call_group_async(b"double_table", [x.tobytes() for x in inputs], hint=2)):
        out = np.frombuffer(fut.result(60), dtype=np.uint32)
        assert np.array_equal(out[: len(x)], x * np.uint32(2)) and not out[len(x) :].any()


def test_device_loss_fails_a_group_then_groups_run_again(rng):
    """The device is lost under a queued group: each ReqId hears device_lost,
    the device is rebuilt, and the next group's values are numpy's."""
    with start_port() as client:
        client.call("execute_kernel", b"double", bytes(4), 1)
        lost = client.call_async("test_hook", terms.atom("destroy_device"))
        in_flight = client.call_group_async(b"double", [bytes(4096)] * 8)
        lost.result(60)
        # Queued behind the loss on the one GPU thread: the group fails as a whole, each caller hearing it.
        assert [outcome(f) for f in in_flight] == [("error", "device_lost")] * 8
        inputs = random_inputs(rng, 16, 50)
        for x, fut in zip(inputs, client.call_group_async(b"double", [x.tobytes() for x in inputs])):
            assert np.array_equal(np.frombuffer(fut.result(60), dtype=np.uint32), x * np.uint32(2))
        assert client.call_plain("stats")["device_rebuilds"] == 1


@pytest.mark.parametrize("spelling", ["node", "term_to_binary"])
def test_a_group_of_no_calls_is_answered_undefined(port, spelling):
    """Entries of zero bytes name no caller: the frame is still answered,
    once, to ReqId undefined (bad_request), not dropped in silence."""
    if spelling == "node":
        frame = group_frames.encode_group(b"double", 1, [], [])
    else:
        frame = _group_term_frame(terms.Binary(b"double"), 1, terms.Binary(b""), terms.Binary(bytes(4)))
    assert refused_undefined(port, frame) == ["bad_request"], "a group of no calls was not answered once"


def test_an_oversized_group_of_no_calls_is_answered_undefined():
    """A group frame over the size limit whose Entries name no caller is
    still answered once (too_large, to ReqId undefined); the port goes on."""
    with start_port(KEM_MAX_INPUT_BYTES=str(16 << 10)) as client:
        frame = group_frames.encode_group(b"double", 1, [], [bytes(3 << 20)])
        assert refused_undefined(client, frame) == ["too_large"], "an oversized group of no calls was not answered once"


def test_a_group_inside_a_calls_frame_loses_no_call(port, rng):
    """A group frame as an item of a calls frame (not what the node sends,
    but a valid term): the calls before and after it and the group's own
    are each answered with numpy's values, and nothing stays held."""
    xs = random_inputs(rng, 4, int(rng.integers(1, 200)))
    port.call("execute_kernel", b"double", xs[0].tobytes(), 1)  # admitted: the group is one job
    before, group_ids, after = port.next_req_ids(1), port.next_req_ids(2), port.next_req_ids(1)
    frames = [
        terms.encode((terms.atom("call"), before[0], terms.atom("execute_kernel"), (terms.Binary(b"double"), terms.Binary(xs[0].tobytes()), 1))),
        group_frames.encode_group(b"double", 1, [(r, 0) for r in group_ids], [xs[1].tobytes(), xs[2].tobytes()]),
        terms.encode((terms.atom("call"), after[0], terms.atom("execute_kernel"), (terms.Binary(b"double"), terms.Binary(xs[3].tobytes()), 1))),
    ]
    futures = port.call_raw_batch(frames, before + group_ids + after)
    for x, fut in zip(xs, futures):
        assert np.array_equal(np.frombuffer(fut.result(30), dtype=np.uint32), x * np.uint32(2))
    assert terms.atom_name(port.call("ping")) == "pong"
    deadline = time.monotonic() + 10
    while port.call_plain("stats")["held_calls"]:
        assert time.monotonic() < deadline, "a call's budget was not given back"
        time.sleep(0.01)


def test_a_group_larger_than_the_byte_budget_runs_as_its_single_calls(rng):
    """KEM_QUEUE_BYTES 1 MiB, an idle budget, a group of 8 calls of 256 KiB
    outputs (2 MiB): the port never holds more than its budget (a lone call
    over it is let in, N of them at once are not); the calls are taken as
    the 8 single calls would be: those that fit run (values vs numpy), the
    others hear overloaded, and nothing is held afterwards."""
    with start_port(KEM_QUEUE_BYTES=str(1 << 20)) as client:
        client.call("execute_kernel", b"double", bytes(4), 1)
        busy = client.call_async("test_hook", terms.atom("sleep_gpu"), 800)
        time.sleep(0.2)
        inputs = random_inputs(rng, 8, 16384)  # 64 KiB each, hint 4: 256 KiB outputs
        futures = client.call_group_async(b"double", [x.tobytes() for x in inputs], hint=4)
        held = client.call_plain("stats")["held_bytes"]
        assert held <= 1 << 20, f"{held} bytes held on a port whose budget is 1 MiB"
        got = [outcome(f, 60) for f in futures]
        assert ("error", "overloaded") in got
        for x, (status, value) in zip(inputs, got):
            if status == "ok":
                want = np.concatenate([x * np.uint32(2), np.zeros(3 * len(x), np.uint32)])
                assert np.array_equal(np.frombuffer(value, dtype=np.uint32), want)
            else:
                assert value == "overloaded"
        assert sum(status == "ok" for status, _ in got) >= 1
        busy.result(30)
        assert client.call_plain("stats")["held_calls"] == 0


def test_a_group_larger_than_one_batch_runs_as_its_single_calls(rng):
    """A group is never split, so one whose outputs pass a batch's bytes
    (gpu_loop.BATCH_BYTES, 64 MiB) would make one batch of them all: 3
    calls of 24 MiB outputs (72 MiB) are taken as their single calls,
    each answered with its own values, and no group job is made."""
    with start_port() as client:
        client.call("execute_kernel", b"double", bytes(4), 1)  # admitted: a group of it would be one job
        before = client.call_plain("stats").get("group_jobs", 0)
        inputs = random_inputs(rng, 3, 1024)  # 4 KiB each, hint 6144: 24 MiB outputs
        futures = client.call_group_async(b"double", [x.tobytes() for x in inputs], hint=6144)
        for x, future in zip(inputs, futures):
            status, value = outcome(future, 120)
            assert status == "ok", value
            got = np.frombuffer(value, dtype=np.uint32)
            assert len(got) == 6144 * len(x)
            assert np.array_equal(got[: len(x)], x * np.uint32(2))
            assert not got[len(x) :].any()
        assert client.call_plain("stats").get("group_jobs", 0) == before
        assert client.call_plain("stats")["held_calls"] == 0
