"""Red-team checks of the one-read road (wire/requests.py, port/router.py,
port/lone_call.py, port/replies.py) against what the port did before it
(003b258: router._handle_request, _handle_group, lone_fold.py): each
frame here was answered, and counted, the same way there. A real Router
on the real adapter, fed frames through a pipe (test_reader_lone.Reader)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kem_port.wire import terms
from kem_port.wire.batch_frames import encode_calls, split_replies
from kem_port.wire.framing import read_frame
from kem_port.wire.group_frames import encode_group
from test_reader_lone import Reader

A, B = terms.atom, terms.Binary


def _gpu_thread_idle(reader: Reader) -> None:
    loop, deadline = reader.router.loop, time.monotonic() + 10
    while (loop.executor_lock.locked() or loop.queue.qsize()) and time.monotonic() < deadline:
        time.sleep(0.01)


def _error_of(reply: tuple) -> tuple[int, str]:
    tag, req_id, (error, (reason, _detail)) = reply
    assert (tag, error) == (A("reply"), A("error")), reply
    return req_id, str(reason)


def _two_queued_calls(reader: Reader, words: np.ndarray) -> list[bytes]:
    """Two calls queued behind the executor's lock, so the GPU thread takes
    them as one batch: the raw frames their answers come back in."""
    with reader.router.loop.executor_lock:
        for req_id in (901, 902):
            reader.send_frame(terms.encode((A("call"), req_id, A("execute_kernel"), (B(b"double"), B(words.tobytes()), 1), 60000)))
            reader.handle_next()
    first = read_frame(reader.replies_in, 1 << 24)
    return [first] if split_replies(first) is not None else [first, read_frame(reader.replies_in, 1 << 24)]


@pytest.mark.parametrize("frame, refused", [
    (encode_group(b"double", 1, [(801, 0)], [b"\1\0\0\0"]), [801]),  # one call: a group holds 2-256
    (encode_group(b"a/b", 1, [(802, 0), (803, 0)], [b"\1\0\0\0"] * 2), [802, 803]),  # a kernel id no call may name
    (encode_group(b"double", 0, [(804, 0), (805, 0)], [b"\1\0\0\0"] * 2), [804, 805]),  # hint 0
    (encode_group(b"double", 1, [], [b"\1\0\0\0"]), [None]),  # no Entries: nobody to name, answered to undefined
], ids=["one call", "bad kernel id", "hint 0", "no entries"])
def test_a_refused_group_frame_is_counted_and_turns_on_replies_frames(frame, refused):
    """Before: a group frame refused by its checks still counted in
    ``group_frames`` and told the writer the peer reads replies frames
    (router._submit_group did both before group_frames.check). The node
    sends group frames only once it reads replies frames, so the next
    batch of small results shares one frame as it did."""
    reader = Reader()
    words = np.arange(4, dtype=np.uint32)
    reader.call(words.tobytes())  # compiled, its kit built
    _gpu_thread_idle(reader)
    reader.send_frame(frame)
    reader.handle_next()
    heard = [_error_of(reader.reply())[0] for _ in refused]
    assert heard == refused
    assert reader.stats.count("group_frames") == 1
    frames = _two_queued_calls(reader, words)
    assert [split_replies(f) for f in frames] == [[(901, (words * 2).tobytes()), (902, (words * 2).tobytes())]]


@pytest.fixture(scope="module")
def reader():
    found = Reader()
    found.call(np.arange(4, dtype=np.uint32).tobytes())  # compiled, its kit built
    return found


@pytest.mark.parametrize("frame", [
    terms.encode((A("call"), 811, A("execute_kernel"), (B(b"double"), B(b""), 1), 60000)),  # the hot shape, empty input
    terms.encode((A("call"), 811, A("execute"), (B(b"double"), B(b"\1\0\0\0"), {A("output_size"): 0}), 60000)),
], ids=["empty input", "output_size 0"])
def test_a_call_with_nothing_to_return_is_answered_on_the_reader_as_before(reader, frame):
    """Before: a lone call to a compiled kernel with an empty output ran
    inline (inline_call.may_run_inline bounded its sizes from above only)
    and was answered <<>> without waking the GPU thread; the reader's lone
    road now sent it to the GPU queue (its `0 < out`)."""
    _gpu_thread_idle(reader)
    inline = reader.stats.count("inline_calls")
    reader.send_frame(frame)
    reader.handle_next()
    tag, req_id, (ok, value) = reader.reply()
    assert (tag, req_id, ok, bytes(value.value)) == (A("reply"), 811, A("ok"), b"")
    assert reader.stats.count("inline_calls") == inline + 1
    assert reader.held() == {"held_calls": 0, "held_bytes": 0}
