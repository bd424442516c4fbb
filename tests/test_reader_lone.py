"""The reader's lone road (inline_call.py, from intake.py) in-process: a real
Router on the real adapter, fed execute_kernel frames through a pipe as the
port reads them, its replies read back off another pipe. A lone call runs
inline and is answered with numpy's values; its budget share comes back
even when its reply fails; a call that may not run inline (the GPU thread
busy, a frame waiting) queues and is answered by the GPU thread; the
reader's lock-free counters lose nothing beside locked ones."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import numpy as np
import pytest

from kem_port.wire import terms
from kem_port.admission.guard import guard_from_config
from kem_port.config import Config
from kem_port.wire.framing import HEADER, FrameWriter, read_frame
from kem_port.gpu.executor import Executor
from kem_port.kernel_store import KernelResolver, default_stores
from kem_port.port.replies import Replies
from kem_port.port.router import Router
from kem_port.stats import Stats
from kem_port.wire.stdio_guard import input_waiting
from test_named_buffers import KERNELS

AXPY = KERNELS["axpy"]  # the uniform at binding 0, y in place

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux


class Reader:
    """A Router as the port builds one, with pipes on both sides."""

    def __init__(self, config: Config | None = None, askers: list | None = None) -> None:
        config = config or Config()
        self.stats = Stats()
        executor = Executor(config, self.stats)
        executor.open()
        self.pipe_in, self.pipe_out = os.pipe()  # frames to the router
        self.replies_in, replies_out = os.pipe()  # its replies
        for fd in (self.pipe_out, replies_out):  # room for a 64 KiB call and its reply, written before they are read
            fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)
        resolver = KernelResolver(default_stores(config.kernel_dir), None)
        waiting = input_waiting(self.pipe_in)
        if askers is not None:  # which threads ask whether input waits
            waiting = _recorded(waiting, askers)
        self.router = Router(config, self.stats, executor, resolver, Replies(FrameWriter(replies_out), self.stats),
                             waiting, guard_from_config(config, self.stats))
        self.router.start()
        self.ids = 0

    def send(self, data: bytes, hint: int = 1, kernel: bytes = b"double", timeout_ms: int = 60000) -> int:
        self.ids += 1
        args = tuple(terms.to_term(a) for a in (kernel, data, hint))
        self.send_frame(terms.encode((terms.atom("call"), self.ids, terms.atom("execute_kernel"), args, timeout_ms)))
        return self.ids

    def send_frame(self, frame: bytes) -> None:
        os.write(self.pipe_out, HEADER.pack(len(frame)) + frame)

    def handle_next(self) -> None:
        self.router.handle_frame(read_frame(self.pipe_in, 1 << 24))

    def reply(self) -> tuple:
        return terms.decode(read_frame(self.replies_in, 1 << 24))

    def call(self, data: bytes) -> tuple:
        self.send(data)
        self.handle_next()
        return self.reply()

    def held(self) -> dict:
        return self.router.intake.budget.describe()


def _recorded(waiting, askers: list):
    def asked():
        askers.append(threading.current_thread().name)
        return waiting()
    return asked


@pytest.fixture(scope="module")
def reader():
    found = Reader()
    found.call(np.zeros(1, np.uint32).tobytes())  # compiled off the reader, run on the GPU thread
    deadline = time.monotonic() + 60
    while found.stats.count("batches") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _gpu_thread_idle(reader: Reader) -> None:
    """Wait until the GPU thread has left its last batch (it holds the
    executor's lock a moment after its reply is written)."""
    loop, deadline = reader.router.loop, time.monotonic() + 10
    while (loop._executor_lock.locked() or loop.queue.qsize()) and time.monotonic() < deadline:
        time.sleep(0.01)


def _ok_value(reply: tuple, req_id: int) -> bytes:
    tag, got_id, (ok, value) = reply
    assert (tag, got_id, ok) == (terms.atom("reply"), req_id, terms.atom("ok")), reply
    return bytes(value.value)


@pytest.mark.parametrize("words", [1, 5, 64, 4000])
def test_a_lone_call_runs_inline_and_answers_numpys_values(reader, rng, words):
    _gpu_thread_idle(reader)
    inline, calls = reader.stats.count("inline_calls"), reader.stats.count("calls")
    for _ in range(3):
        data = rng.integers(0, 2**32, words, dtype=np.uint32)
        req_id = reader.send(data.tobytes())
        reader.handle_next()
        assert _ok_value(reader.reply(), req_id) == (data * np.uint32(2)).tobytes()
        assert reader.held() == {"held_calls": 0, "held_bytes": 0}
    assert reader.stats.count("inline_calls") == inline + 3
    assert reader.stats.count("calls") == calls + 3


def test_a_failed_reply_still_gives_back_the_budget(reader, rng, monkeypatch):
    writer = reader.router.replies.writer

    def broken(req_id, payload):
        raise RuntimeError("the reply could not be written")

    monkeypatch.setattr(writer, "write_result", broken)
    reader.send(rng.integers(0, 2**32, 4, dtype=np.uint32).tobytes())
    reader.handle_next()
    assert reader.held() == {"held_calls": 0, "held_bytes": 0}
    monkeypatch.undo()
    data = rng.integers(0, 2**32, 4, dtype=np.uint32)
    assert _ok_value(reader.call(data.tobytes()), reader.ids) == (data * np.uint32(2)).tobytes()


def test_a_call_queues_while_the_gpu_thread_is_busy(reader, rng):
    """The executor's lock held (the GPU thread inside a batch): the call is
    not run inline, it waits in the queue, call_state says so, and the GPU
    thread answers it once the lock is free."""
    loop = reader.router.loop
    inline = reader.stats.count("inline_calls")
    data = rng.integers(0, 2**32, 16, dtype=np.uint32)
    with loop._executor_lock:
        req_id = reader.send(data.tobytes())
        reader.handle_next()
        assert loop.state_of(req_id) == ("queued", 0)
        assert reader.held()["held_calls"] == 1
    assert _ok_value(reader.reply(), req_id) == (data * np.uint32(2)).tobytes()
    assert reader.stats.count("inline_calls") == inline
    deadline = time.monotonic() + 10
    while reader.held()["held_calls"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reader.held() == {"held_calls": 0, "held_bytes": 0}


def test_a_call_with_a_frame_waiting_behind_it_queues(reader, rng):
    inline = reader.stats.count("inline_calls")
    first, second = (rng.integers(0, 2**32, 8, dtype=np.uint32) for _ in range(2))
    ids = [reader.send(first.tobytes()), reader.send(second.tobytes())]
    reader.handle_next()  # the second frame is in the pipe: the first queues
    reader.handle_next()  # the queue may still hold the first: this one queues or runs after it
    replies = {}
    for _ in range(2):
        reply = reader.reply()
        replies[reply[1]] = reply
    assert _ok_value(replies[ids[0]], ids[0]) == (first * np.uint32(2)).tobytes()
    assert _ok_value(replies[ids[1]], ids[1]) == (second * np.uint32(2)).tobytes()
    assert reader.stats.count("inline_calls") <= inline + 1


def test_reader_counters_lose_nothing_beside_locked_ones():
    stats = Stats()
    stop = threading.Event()

    def other_thread() -> None:
        while not stop.is_set():
            stats.inc("batches")
            stats.inc(f"other_{stats.count('batches') % 50}")  # new keys: the dict grows meanwhile

    worker = threading.Thread(target=other_thread)
    worker.start()
    try:
        for _ in range(200_000):
            stats.count_on_reader("calls")
    finally:
        stop.set()
        worker.join()
    assert stats.count("calls") == 200_000
    assert stats.snapshot()["calls"] == 200_000


@pytest.mark.parametrize("size", [0, 4, 1000, 64 * 1024])
def test_a_lone_reply_frame_is_the_library_encoding(rng, size):
    """terms.ok_binary_frame: the frame length and erlang-py's encoding of
    {reply, ReqId, {ok, Payload}}, for ReqIds of every form."""
    payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    for req_id in (0, 255, 256, 2**31 - 1, 2**31, 2**40, int(rng.integers(0, 2**62))):
        framed = terms.ok_binary_frame(req_id, memoryview(payload))
        want = terms.encode((terms.atom("reply"), req_id, (terms.atom("ok"), terms.Binary(payload))))
        assert framed == HEADER.pack(len(want)) + want


def test_only_the_reader_asks_whether_input_waits(tmp_path, rng):
    """A poll object refuses two threads polling at once ("concurrent poll()
    invocation"; CI saw it as a named call's internal error): a named call
    admitted on a fetch thread is queued without asking, and is right."""
    (tmp_path / "axpy.wgsl").write_text(AXPY)
    askers: list[str] = []
    reader = Reader(Config(kernel_dir=tmp_path, cache_dir=tmp_path / "cache"), askers)
    for n in (1, 64, 1000):
        x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        params = np.array([3.0], np.float32).tobytes() + np.array([n], np.uint32).tobytes()
        buffers = {b"params": params, b"x": x.tobytes(), b"y": y.tobytes()}
        req_id = reader.ids = reader.ids + 1
        args = tuple(terms.to_term(a) for a in (b"axpy", buffers, {"grid": (n, 1, 1)}))
        reader.send_frame(terms.encode((terms.atom("call"), req_id, terms.atom("run"), args, 60000)))
        reader.handle_next()
        tag, got_id, (ok, value) = reader.reply()
        assert (tag, got_id, ok) == (terms.atom("reply"), req_id, terms.atom("ok")), value
        got = np.frombuffer(bytes(value[terms.Binary(b"y")].value), np.float32)
        np.testing.assert_allclose(got, np.float32(3.0) * x + y, rtol=1e-6, atol=1e-6)
    assert askers and set(askers) == {threading.current_thread().name}


def test_a_named_call_that_fails_before_it_runs_gives_its_share_back(tmp_path, rng, monkeypatch):
    """RunMethods._queue takes the call's share first; a failure before the
    run starts (here NamedRuns.small raising, as two races once made it)
    answers the caller and gives the share back, not held for good."""
    (tmp_path / "axpy.wgsl").write_text(AXPY)
    reader = Reader(Config(kernel_dir=tmp_path, cache_dir=tmp_path / "cache"))
    n = 64
    params = np.array([3.0], np.float32).tobytes() + np.array([n], np.uint32).tobytes()

    def run_once() -> tuple:
        x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        req_id = reader.ids = reader.ids + 1
        args = tuple(terms.to_term(a) for a in (b"axpy", {b"params": params, b"x": x.tobytes(), b"y": y.tobytes()},
                                                {"grid": (n, 1, 1)}))
        reader.send_frame(terms.encode((terms.atom("call"), req_id, terms.atom("run"), args, 60000)))
        reader.handle_next()
        return reader.reply()[2], x, y

    (ok, _), _, _ = run_once()  # admitted on a fetch thread
    assert ok == terms.atom("ok")

    def broken(*_args):
        raise RuntimeError("small failed")

    monkeypatch.setattr(reader.router.loop.executor.named, "small", broken)
    (error, (reason, _detail)), _, _ = run_once()
    assert (error, reason) == (terms.atom("error"), terms.atom("internal"))
    assert reader.held() == {"held_calls": 0, "held_bytes": 0}
    monkeypatch.undo()
    (ok, value), x, y = run_once()
    assert ok == terms.atom("ok")
    np.testing.assert_allclose(np.frombuffer(bytes(value[terms.Binary(b"y")].value), np.float32), np.float32(3.0) * x + y, rtol=1e-6, atol=1e-6)
    assert reader.held() == {"held_calls": 0, "held_bytes": 0}


def test_a_named_call_gives_its_share_back_before_its_reply_is_written(tmp_path, rng, monkeypatch):
    """A caller holding its answer must never see its share still held: CI
    read ``held_calls`` 1 from a stats call sent right after the last named
    reply, because the GPU thread wrote replies and then gave shares back.
    Every reply write here records the budget at that moment."""
    (tmp_path / "axpy.wgsl").write_text(AXPY)
    reader = Reader(Config(kernel_dir=tmp_path, cache_dir=tmp_path / "cache"))
    replies, seen = reader.router.replies, []
    real_write = replies.write  # a named reply's road (run_methods._answer), bound once by Replies

    def recording(frames):
        seen.append(reader.held())
        return real_write(frames)

    monkeypatch.setattr(replies, "write", recording)
    for n in (1, 64, 1000):  # the first call is admitted on a fetch thread and queued: the GPU thread answers
        x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        params = np.array([2.5], np.float32).tobytes() + np.array([n], np.uint32).tobytes()
        req_id = reader.ids = reader.ids + 1
        args = tuple(terms.to_term(a) for a in (b"axpy", {b"params": params, b"x": x.tobytes(), b"y": y.tobytes()},
                                                {"grid": (n, 1, 1)}))
        reader.send_frame(terms.encode((terms.atom("call"), req_id, terms.atom("run"), args, 60000)))
        reader.handle_next()
        tag, got_id, (ok, value) = reader.reply()
        assert (tag, got_id, ok) == (terms.atom("reply"), req_id, terms.atom("ok")), value
        np.testing.assert_allclose(np.frombuffer(bytes(value[terms.Binary(b"y")].value), np.float32),
                                   np.float32(2.5) * x + y, rtol=1e-6, atol=1e-6)
    assert len(seen) == 3 and all(held == {"held_calls": 0, "held_bytes": 0} for held in seen), seen
