"""The reader's lone road (port/lone_call.py) in-process: a real Router on the real
adapter, frames in and replies out through pipes (test_reader_lone.py's
Reader). A hot lone call is answered off its kit with numpy's values; a
call off the hot shape takes today's road and is answered the same; every
refusal is byte for byte the reply today's road gives to the same frame
(the router with its fold turned off); call_state says ``running`` while
the reader runs a call inline; a kit's GPU error and a lost device are
answered as today's road answers them."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import reference
from kem_port.wire import terms
from kem_port.config import Config
from kem_port.wire.framing import read_frame
from kem_port.wire.stdio_guard import input_waiting, spin_for_input
from test_executor import FIXED_INPUT  # an input binding kem passes and wgpu's validation fails
from test_reader_lone import Reader, _gpu_thread_idle, _ok_value


class Watched:
    """Counts the folded road's kit calls and today's road's intake.submit calls."""

    def __init__(self, reader: Reader, monkeypatch) -> None:
        self.known = self.today = 0
        lone, intake = reader.router.lone.lone, reader.router.intake
        run_known, submit = lone.run_known, intake.submit

        def counted_known(*args):
            found = run_known(*args)
            self.known += found is not None
            return found

        def counted_submit(*args):
            self.today += 1
            return submit(*args)

        monkeypatch.setattr(lone, "run_known", counted_known)
        monkeypatch.setattr(intake, "submit", counted_submit)


def _warm(reader: Reader, data: bytes, hint: int = 1, kernel: bytes = b"double") -> None:
    """Admit and compile the kernel and build the shape's kit (today's road)."""
    for _ in range(3):
        req_id = reader.send(data, hint, kernel)
        reader.handle_next()
        reader.reply()
        _gpu_thread_idle(reader)
    assert req_id


@pytest.fixture(scope="module")
def reader():
    found = Reader()
    _warm(found, np.zeros(1, np.uint32).tobytes())
    return found


def _raw_reply(reader: Reader) -> bytes:
    return read_frame(reader.replies_in, 1 << 24)


@pytest.mark.parametrize("size", [4, 7, 64, 1000, 4096, 64 * 1024])
def test_a_folded_call_answers_numpys_values(reader, rng, size, monkeypatch):
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    _warm(reader, data)  # this shape's kit
    watched = Watched(reader, monkeypatch)
    inline, calls, kits = (reader.stats.count(n) for n in ("inline_calls", "calls", "lone_kit_calls"))
    for _ in range(3):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        want = reference.double(data, size)
        req_id = reader.send(data)
        reader.handle_next()
        assert _ok_value(reader.reply(), req_id) == want
    assert (watched.known, watched.today) == (3, 0)
    assert [reader.stats.count(n) for n in ("inline_calls", "calls", "lone_kit_calls")] == [inline + 3, calls + 3, kits + 3]
    assert reader.held() == {"held_calls": 0, "held_bytes": 0}


def test_calls_off_the_hot_shape_take_todays_road(reader, rng, monkeypatch):
    """Over 64 KiB, or a frame waiting behind it: intake's road (queued);
    a hint of 2 (a shape with no kit yet): the reader's lone road builds its
    kit (GpuLoop.run_held); each answered with the same values."""
    watched = Watched(reader, monkeypatch)
    large = rng.integers(0, 2**32, 20000, dtype=np.uint32)
    req_id = reader.send(large.tobytes())
    reader.handle_next()
    assert _ok_value(reader.reply(), req_id) == (large * np.uint32(2)).tobytes()
    _gpu_thread_idle(reader)
    assert watched.today == 1
    built = reader.stats.count("lone_kits_built")
    small = rng.integers(0, 2**32, 8, dtype=np.uint32)
    req_id = reader.send(small.tobytes(), hint=2)
    reader.handle_next()
    got = _ok_value(reader.reply(), req_id)
    assert got[:32] == (small * np.uint32(2)).tobytes() and got[32:] == bytes(32)
    assert watched.today == 1 and reader.stats.count("lone_kits_built") == built + 1
    _gpu_thread_idle(reader)
    first, second = (rng.integers(0, 2**32, 1, dtype=np.uint32) for _ in range(2))
    ids = [reader.send(first.tobytes()), reader.send(second.tobytes())]
    reader.handle_next()  # the second frame waits in the pipe: the first queues
    reader.handle_next()
    replies = {reply[1]: reply for reply in (reader.reply(), reader.reply())}
    assert _ok_value(replies[ids[0]], ids[0]) == (first * np.uint32(2)).tobytes()
    assert _ok_value(replies[ids[1]], ids[1]) == (second * np.uint32(2)).tobytes()
    assert watched.today >= 2  # the first queued (the second may run inline once the GPU thread is idle again)


def _call_frame(req_id, kernel, data, hint, timeout) -> bytes:
    args = tuple(terms.to_term(a) for a in (kernel, data, hint))
    return terms.encode((terms.atom("call"), req_id, terms.atom("execute_kernel"), args, timeout))


BAD_FRAMES = {
    "timeout 0": _call_frame(7, b"double", bytes(4), 1, 0),
    "hint 0": _call_frame(7, b"double", bytes(4), 0, 60000),
    "output over the limit": _call_frame(7, b"double", bytes(4), 1 << 40, 60000),
    "input over the limit": _call_frame(7, b"double", bytes(4096 + 4), 1, 60000),
    "kernel id characters": _call_frame(7, b"dou/ble", bytes(4), 1, 60000),
    "kernel id too long": _call_frame(7, b"d" * 129, bytes(4), 1, 60000),
    "no such kernel": _call_frame(7, b"no_such_kernel", bytes(4), 1, 60000),
    "ReqId over 2^64": _call_frame(2**64, b"double", bytes(4), 1, 60000),
    "trailing bytes": _call_frame(7, b"double", bytes(4), 1, 60000) + b"\0",
    "truncated": _call_frame(7, b"double", bytes(4), 1, 60000)[:-3],
}


@pytest.fixture(scope="module")
def limited():
    found = Reader(Config(max_input_bytes=4096, max_output_bytes=16384, queue_limit=4))
    _warm(found, bytes(4))
    return found


def _both_roads(reader: Reader, frame: bytes, monkeypatch) -> tuple[bytes, bytes]:
    """The reply to frame with the fold on, then with it off (today's road)."""
    replies = []
    for fold in (reader.router.lone, lambda frame: False):
        monkeypatch.setattr(reader.router, "lone", fold)
        reader.send_frame(frame)
        reader.handle_next()
        replies.append(_raw_reply(reader))
        _gpu_thread_idle(reader)
    monkeypatch.undo()
    return replies[0], replies[1]


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_each_refusal_is_todays_reply(limited, name, monkeypatch):
    folded, today = _both_roads(limited, BAD_FRAMES[name], monkeypatch)
    assert folded == today
    tag, _, (error, _) = terms.decode(folded)
    assert (tag, error) == (terms.atom("reply"), terms.atom("error"))


def test_a_full_budget_is_todays_overloaded(limited, monkeypatch):
    """Calls held elsewhere (a fetch, the compile worker) fill the budget:
    the hot lone call hears overloaded, as on today's road."""
    budget = limited.router.intake.budget
    budget.take_many(budget.max_calls, 0)
    try:
        folded, today = _both_roads(limited, _call_frame(9, b"double", bytes(4), 1, 60000), monkeypatch)
    finally:
        budget.give_many(budget.max_calls, 0)
    assert folded == today
    assert terms.decode(folded)[2][1][0] == terms.atom("overloaded")
    assert budget.describe() == {"held_calls": 0, "held_bytes": 0}


@pytest.mark.parametrize("timeout_ms", [1, 2**32, 2**64 - 1])
def test_a_lone_call_with_any_valid_timeout_is_answered_as_today(limited, rng, timeout_ms, monkeypatch):
    """The node's timeout bounds waits in the queue and for a fetch; a call
    the reader runs at once is answered, with a 1 ms timeout too."""
    data = rng.integers(0, 2**32, 1, dtype=np.uint32)
    folded, today = _both_roads(limited, _call_frame(11, b"double", data.tobytes(), 1, timeout_ms), monkeypatch)
    assert _ok_value(terms.decode(folded), 11) == (data * np.uint32(2)).tobytes()
    if folded != today:
        # Today's road hands the call to the GPU thread through a queue: on a
        # loaded machine (CI) 1 ms can pass there first, and today's answer
        # is then the queue timeout. The folded road never waits in a queue.
        assert timeout_ms == 1
        tag, _, (error, (reason, detail)) = terms.decode(today)
        assert (error, reason) == (terms.atom("error"), terms.atom("timeout"))
        assert b"in the port's queue" in terms.binary_bytes(detail)


def test_the_folded_reply_is_todays_for_every_req_id_form(limited, rng, monkeypatch):
    for req_id in (0, 255, 256, 2**31 - 1, 2**31, 2**40, 2**64 - 1):
        data = rng.integers(0, 2**32, 1, dtype=np.uint32)
        folded, today = _both_roads(limited, _call_frame(req_id, b"double", data.tobytes(), 1, 60000), monkeypatch)
        assert folded == today
        assert _ok_value(terms.decode(folded), req_id) == (data * np.uint32(2)).tobytes()


def test_call_state_says_running_while_the_reader_runs_a_call(reader, rng, monkeypatch):
    """On both branches of the reader's lone road (a hot call on its built
    kit, and any other through the executor's lone road), asked while the
    kit runs; unknown once it is answered."""
    states = reader.router.intake.states
    seen: list[str] = []
    lone, executor = reader.router.lone.lone, reader.router.executor
    run_known, run_lone = lone.run_known, executor.run_lone

    def asking_known(key, data):
        seen.append(states.describe(reader.ids)["state"])
        return run_known(key, data)

    def asking_lone(job):
        seen.append(states.describe(job.tag)["state"])
        return run_lone(job)

    monkeypatch.setattr(lone, "run_known", asking_known)
    monkeypatch.setattr(executor, "run_lone", asking_lone)
    data = rng.integers(0, 2**32, 1, dtype=np.uint32)
    assert _ok_value(reader.call(data.tobytes()), reader.ids) == (data * np.uint32(2)).tobytes()
    reader.ids += 1  # the same call off the hot shape (execute, with options): the executor's lone road
    opts = {terms.atom("output_size_hint"): 1}
    args = (terms.Binary(b"double"), terms.Binary(data.tobytes()), opts)
    reader.send_frame(terms.encode((terms.atom("call"), reader.ids, terms.atom("execute"), args, 60000)))
    reader.handle_next()
    assert _ok_value(reader.reply(), reader.ids) == (data * np.uint32(2)).tobytes()
    assert seen == ["running", "running"]
    assert states.describe(reader.ids)["state"] == "unknown"


def test_a_failed_reply_write_is_logged_and_the_road_stays_open(reader, rng, monkeypatch):
    def broken(data):
        raise RuntimeError("the reply could not be written")

    monkeypatch.setattr(reader.router.lone, "write_one", broken)
    reader.send(rng.integers(0, 2**32, 1, dtype=np.uint32).tobytes())
    reader.handle_next()
    monkeypatch.undo()
    assert not reader.router.loop.executor_lock.locked() and reader.router.loop.inline_tag is None
    data = rng.integers(0, 2**32, 1, dtype=np.uint32)
    assert _ok_value(reader.call(data.tobytes()), reader.ids) == (data * np.uint32(2)).tobytes()


def test_a_gpu_error_is_todays_reply(tmp_path, rng, monkeypatch):
    """wgpu refuses a binding smaller than the kernel's array: the same
    gpu_error either way (the failing shape never keeps a kit), and the
    kernel's good shape runs folded right after."""
    (tmp_path / "fixed_input.wgsl").write_bytes(FIXED_INPUT)
    reader = Reader(Config(kernel_dir=tmp_path))
    good = rng.integers(0, 256, 256, dtype=np.uint8).tobytes()
    _warm(reader, good, kernel=b"fixed_input")  # admitted, compiled, its kit built
    folded, today = _both_roads(reader, _call_frame(21, b"fixed_input", bytes(4), 64, 60000), monkeypatch)
    assert folded == today
    tag, req_id, (error, (reason, detail)) = terms.decode(folded)
    assert (req_id, error, reason) == (21, terms.atom("error"), terms.atom("gpu_error"))
    assert "binding" in bytes(detail.value).decode().lower()
    watched = Watched(reader, monkeypatch)
    req_id = reader.send(good, kernel=b"fixed_input")
    reader.handle_next()
    assert _ok_value(reader.reply(), req_id) == good and watched.known == 1


def test_device_loss_on_the_folded_road_is_answered_and_rebuilt(rng):
    reader = Reader()
    data = rng.integers(0, 2**32, 16, dtype=np.uint32)
    _warm(reader, data.tobytes())
    executor = reader.router.executor
    old = executor.gpu.device
    executor.destroy_device_for_test()
    req_id = reader.send(data.tobytes())
    reader.handle_next()
    tag, got_id, (error, (reason, _)) = reader.reply()
    assert (got_id, error, reason) == (req_id, terms.atom("error"), terms.atom("device_lost"))
    assert reader.stats.count("device_rebuilds") == 1 and executor.gpu.device is not old
    assert len(executor.lone) == 0
    _warm(reader, data.tobytes())  # compiled again, a new kit
    assert _ok_value(reader.call(data.tobytes()), reader.ids) == (data * np.uint32(2)).tobytes()


@pytest.mark.parametrize("size", [4, 5, 4096, 64 * 1024])
def test_lone_calls_through_the_real_port_answer_numpys_values(port, rng, size):
    """The port process as the node runs it, one call at a time with the
    node's TimeoutMs (the shape the fold takes once the kit is built)."""
    for _ in range(4):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        got = port.call_async("execute_kernel", b"double", data, 1, timeout_ms=60000).result(60)
        assert got == reference.double(data, size)
    stats = port.call_plain("stats")
    assert stats["lone_kit_calls"] >= 3 and stats["inline_calls"] >= 3


def test_a_call_sent_to_todays_road_keeps_its_deadline(reader, rng):
    """The GPU thread busy (its lock held): the fold hands the call to
    today's road with the node's deadline, so a call whose 1 ms passes in
    the queue hears timeout, and one with time left is answered."""
    loop, inline = reader.router.loop, reader.stats.count("inline_calls")
    late, fine = (rng.integers(0, 2**32, 4, dtype=np.uint32) for _ in range(2))
    with loop.executor_lock:
        late_id = reader.send(late.tobytes(), timeout_ms=1)
        reader.handle_next()
        fine_id = reader.send(fine.tobytes())
        reader.handle_next()
        assert reader.stats.count("inline_calls") == inline  # both went to the GPU thread's queue
        time.sleep(0.05)
    replies = {reply[1]: reply for reply in (reader.reply(), reader.reply())}
    tag, _, (error, (reason, _)) = replies[late_id]
    assert (error, reason) == (terms.atom("error"), terms.atom("timeout"))
    assert _ok_value(replies[fine_id], fine_id) == (fine * np.uint32(2)).tobytes()
    _gpu_thread_idle(reader)


def test_a_kernel_file_that_cannot_be_read_is_todays_refusal(tmp_path, monkeypatch):
    """A kernel file that is not UTF-8 (the store refuses it while the
    fold looks the kernel up): today's road answers, with today's reply."""
    (tmp_path / "not_text.wgsl").write_bytes(b"\xff\xfe\x00kernel")
    reader = Reader(Config(kernel_dir=tmp_path))
    _warm(reader, bytes(4))
    folded, today = _both_roads(reader, _call_frame(31, b"not_text", bytes(4), 1, 60000), monkeypatch)
    assert folded == today
    tag, req_id, (error, (reason, _)) = terms.decode(folded)
    assert (req_id, error, reason) == (31, terms.atom("error"), terms.atom("bad_kernel"))


def test_the_readers_spin_ends_when_a_frame_waits_or_its_time_is_up():
    """stdio_guard.spin_for_input (KEM_READ_SPIN_US): it returns as soon as
    bytes wait in the pipe, and, with none, once its time has passed."""
    pipe_in, pipe_out = os.pipe()
    try:
        waiting = input_waiting(pipe_in)
        started = time.perf_counter()
        spin_for_input(waiting, 0.02)
        assert time.perf_counter() - started >= 0.02 and not waiting()
        os.write(pipe_out, b"\0\0\0\0")
        started = time.perf_counter()
        spin_for_input(waiting, 30.0)  # would hold the test for 30 s if it ignored the waiting bytes
        assert time.perf_counter() - started < 10.0 and waiting()
    finally:
        os.close(pipe_in)
        os.close(pipe_out)


def test_the_read_spin_is_a_setting():
    assert Config().read_spin_us == 0
    assert Config.from_env({"KEM_READ_SPIN_US": "50"}).read_spin_us == 50
    assert Config.from_env({"KEM_READ_SPIN_US": "0"}).read_spin_us == 0
