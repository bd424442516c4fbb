"""Sessions and chains against numpy on fresh random data, through a real
port (docs/sessions.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import reference
from conftest import start_port

from kem_port.wire import terms
from kem_port.client import PortClient, PortError, PortSession

KERNELS = str(Path(__file__).resolve().parent / "session_kernels")


def words(*values: int) -> bytes:
    return np.array(values, dtype="<u4").tobytes()


def life(grid: np.ndarray) -> np.ndarray:
    """One generation of Conway's life on a torus (the life.wgsl reference)."""
    n = sum(np.roll(np.roll(grid, dy, 0), dx, 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0))
    return ((n == 3) | ((grid == 1) & (n == 2))).astype("<u4")


def held(port: PortClient) -> tuple[int, int]:
    """(bytes in session buffers, pool bytes in use) from the port's stats."""
    stats = {terms.atom_name(k): v for k, v in port.call("stats").items()}
    return stats["session_bytes"], stats["pool_live_bytes"] - stats["pool_idle_bytes"]


@pytest.fixture(scope="module")
def sport():
    with start_port(KEM_KERNEL_DIR=KERNELS) as client:
        yield client


@pytest.fixture
def session(sport):
    s = sport.session_open()
    yield s
    try:
        s.close()
    except PortError:
        pass


def test_buffers_create_write_read_list_free(session, rng):
    for size in (4, 64, 4100, 65536):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        session.create(f"b{size}", data)
        assert session.read(f"b{size}") == data
    session.create("z", 1024)
    assert session.read("z") == bytes(1024)
    patch = rng.integers(0, 256, 256, dtype=np.uint8).tobytes()
    session.write("z", 512, patch)
    assert session.read("z") == bytes(512) + patch + bytes(256)
    assert session.read("z", 508, 8) == bytes(4) + patch[:4]
    assert session.list() == {"b4": 4, "b64": 64, "b4100": 4100, "b65536": 65536, "z": 1024}
    session.free("b64")
    assert "b64" not in session.list()
    for bad in (lambda: session.read("z", 1020, 8), lambda: session.write("z", 2, b"abcd"), lambda: session.create("9x", 4),
                lambda: session.create("odd", b"abc"), lambda: session.create("z", 4)):
        with pytest.raises(PortError) as exc:
            bad()
        assert exc.value.reason in ("bad_args", "buffer_exists")
    with pytest.raises(PortError) as exc:
        session.read("b64")
    assert exc.value.reason == "no_buffer"


@pytest.mark.parametrize("words_range", [(100, 5000), (20_000, 40_000)])  # on the reader; on the GPU thread
def test_accumulate_state_over_many_calls_equals_host(session, rng, words_range):
    n = int(rng.integers(*words_range))
    start = rng.integers(0, 2**32, n, dtype=np.uint32)
    session.create("acc", start.tobytes())
    expected = start.copy()
    for _ in range(25):
        step = rng.integers(0, 2**32, n, dtype=np.uint32)
        expected = expected + step  # wraps like u32
        out = session.call("accumulate", step.tobytes(), output_size=0)
        assert out == b""
    assert np.array_equal(np.frombuffer(session.read("acc"), "<u4"), expected)
    # The call's own output still works: it returns the state after the step.
    step = rng.integers(0, 2**32, n, dtype=np.uint32)
    out = session.call("accumulate", step.tobytes())
    assert np.array_equal(np.frombuffer(out, "<u4"), expected + step)


def test_small_session_work_runs_on_the_reader(sport):
    """Small session calls skip the GPU thread's wake-up; large ones queue."""
    def inline() -> int:
        return {terms.atom_name(k): v for k, v in sport.call("stats").items()}.get("inline_session_calls", 0)

    s = sport.session_open()
    s.create("acc", 4096)
    # Compiled first: only work whose pipelines are built runs inline (a compile
    # takes tens of ms), and which earlier test warmed it depends on the order.
    s.call("accumulate", words(1), output_size=0)
    before = inline()
    s.call("accumulate", words(1), output_size=0)
    assert inline() > before
    s.create("big", 1 << 20)
    before = inline()
    s.call("accumulate", words(1), output_size=0, bind={"acc": "big"})
    assert inline() == before
    assert np.frombuffer(s.read("big", 0, 8), "<u4").tolist() == [1, 1]
    s.close()


@pytest.mark.parametrize("w, h", [(8, 8), (37, 23), (64, 50)])
def test_life_ping_pong_equals_host(session, rng, w, h):
    grid = rng.integers(0, 2, (h, w), dtype=np.uint32).astype("<u4")
    session.create("a", grid.tobytes())
    session.create("b", grid.nbytes)
    size = words(w, h)
    for generation in range(12):
        src, dst = ("a", "b") if generation % 2 == 0 else ("b", "a")
        session.call("life", b"", output_size=0, params=size, bind={"cur": src, "next": dst})
        grid = life(grid)
    assert np.array_equal(np.frombuffer(session.read("a"), "<u4").reshape(h, w), grid)
    # The same generations as one chain: one submission, state in and out.
    steps = [{"kernel": "life", "params": size, "output_size": 0, "bind": {"cur": s, "next": d}}
             for s, d in [("a", "b"), ("b", "a")] * 5]
    assert session.chain(steps, returns=["a"]) == {"a": life_n(grid, 10).tobytes()}


def life_n(grid: np.ndarray, n: int) -> np.ndarray:
    for _ in range(n):
        grid = life(grid)
    return grid


@pytest.mark.parametrize("size", [4, 37, 4096, 100_003])
def test_stateless_chain_equals_composition(sport, rng, size):
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    words_up = -(-size // 4) * 4
    steps = [{"kernel": "double", "output_size": words_up}, {"kernel": "double", "output_size": 2 * words_up},
             {"kernel": "double", "output_size": 2 * size - 1}]
    expected = reference.double(reference.double(reference.double(data, words_up), 2 * words_up), 2 * size - 1)
    assert sport.chain(steps, input=data) == expected
    if size % 4:  # an odd intermediate: refused, since the chain could not cut it as a call does
        with pytest.raises(PortError) as exc:
            sport.chain([{"kernel": "double"}, {"kernel": "double"}], input=data)
        assert (exc.value.reason, exc.value.step) == ("bad_args", 2)
    # Named temporaries come back only when asked for.
    named = [{"kernel": "double", "output": "once", "output_size": words_up}, {"kernel": "double", "output": "twice"}]
    got = sport.chain(named, input=data, returns=["once", "twice"])
    once = reference.double(data, words_up)
    assert got == {"once": once, "twice": reference.double(once, words_up)}


def test_image_pipeline_chain_equals_composition(sport, rng):
    w, h = int(rng.integers(9, 80)), int(rng.integers(9, 60))
    image = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    seed, strength, pixel = int(rng.integers(0, 2**31)), int(rng.integers(1, 30)), int(rng.integers(1, 9))
    steps = [
        {"kernel": "glitch", "params": words(w, h, seed, strength)},
        {"kernel": "pixelize", "params": words(w, h, pixel, 0)},
        {"kernel": "double"},
    ]
    expected = reference.pixelize(reference.glitch(image, seed, strength), pixel).tobytes()
    assert sport.chain(steps, input=image.tobytes()) == reference.double(expected, len(expected))


def test_every_step_is_validated_before_anything_runs(session, rng):
    start = rng.integers(0, 2**32, 64, dtype=np.uint32)
    session.create("acc", start.tobytes())
    bump = {"kernel": "accumulate", "output_size": 0}
    cases = [
        ({"kernel": "accumulate", "bind": {"acc": "missing"}}, "no_buffer"),
        ({"kernel": "accumulate", "bind": {"nope": "acc"}}, "bad_args"),
        ({"kernel": "accumulate", "input": "acc", "output_size": 0}, "bad_args"),  # acc read and written
        ({"kernel": "no_such_kernel"}, "kernel_not_found"),
        ({"kernel": "bad_uniform"}, "bad_args"),  # a uniform at 3 takes the step's bytes: none given
        ({"kernel": "sampled"}, "bad_kernel"),  # a texture: kem binds buffers only
        ({"kernel": "double_table"}, "bad_kernel"),  # a call-table kernel: plain calls only
        ({"kernel": "writes_readonly", "bind": {"state": "acc"}}, "shader_error"),
        ({"kernel": "double", "colour": 1}, "bad_args"),
    ]
    for bad, reason in cases:
        with pytest.raises(PortError) as exc:
            session.chain([bump, bad], input=start.tobytes())
        assert (exc.value.reason, exc.value.step) == (reason, 2), bad
    assert session.read("acc") == start.tobytes()  # step 1 never ran


def test_two_sessions_never_see_each_other(sport, rng):
    a, b = sport.session_open(), sport.session_open()
    secret = rng.integers(1, 256, 4096, dtype=np.uint8).tobytes()
    a.create("x", secret)
    with pytest.raises(PortError) as exc:
        b.read("x")
    assert exc.value.reason == "no_buffer"
    with pytest.raises(PortError):
        b.call("accumulate", words(1), output_size=0)  # binds b's acc: there is none
    a.close()
    b.create("x", 4096)  # likely the very pooled buffer a just gave back
    assert b.read("x") == bytes(4096)
    with pytest.raises(PortError) as exc:
        a.read("x")
    assert exc.value.reason == "session_lost"
    b.close()


def test_closing_returns_memory_to_the_pool(sport, rng):
    baseline = held(sport)
    s = sport.session_open()
    for i in range(5):
        s.create(f"m{i}", 1 << 20)
    assert held(sport)[0] == baseline[0] + 5 * (1 << 20)
    s.close()
    assert held(sport) == baseline


def test_quotas_are_enforced_before_allocating():
    with start_port(KEM_KERNEL_DIR=KERNELS, KEM_SESSION_QUOTA_BYTES="65536", KEM_PORT_SESSION_QUOTA_BYTES="98304") as port:
        s = port.session_open()
        s.create("a", 65536)
        with pytest.raises(PortError) as exc:
            s.create("b", 4)
        assert exc.value.reason == "quota_exceeded"
        t = port.session_open(quota=32768)
        t.create("a", 32768)
        with pytest.raises(PortError) as exc:
            port.session_open().create("c", 4)  # the port's total
        assert exc.value.reason == "quota_exceeded"
        with pytest.raises(PortError) as exc:
            port.session_open(quota=65540)
        assert exc.value.reason == "quota_exceeded"
        with pytest.raises(PortError) as exc:
            port.chain([{"kernel": "double", "output_size": 70000}])  # temporaries count too
        assert exc.value.reason == "quota_exceeded"
        assert held(port)[0] == 65536 + 32768


def test_a_session_is_lost_with_its_device_or_port():
    with start_port(KEM_KERNEL_DIR=KERNELS) as port:
        s = port.session_open()
        s.create("acc", words(1, 2, 3, 4))
        stale = PortSession(port, (s.ref[0] + 1, s.ref[1]))  # another incarnation
        with pytest.raises(PortError) as exc:
            stale.read("acc")
        assert exc.value.reason == "session_lost"
        assert port.call("execute", b"double", words(1), {}) == words(2)  # compiled before the loss
        port.call("test_hook", terms.atom("destroy_device"))
        with pytest.raises(PortError) as exc:  # the call that finds the loss rebuilds the device
            port.call("execute", b"double", words(1), {})
        assert exc.value.reason == "device_lost"
        assert port.call("execute", b"double", words(1), {}) == words(2)
        for use in (lambda: s.read("acc"), lambda: s.call("accumulate", words(1), output_size=0), s.list):
            with pytest.raises(PortError) as exc:
                use()
            assert exc.value.reason == "session_lost"
        fresh = port.session_open()
        fresh.create("acc", words(5))
        assert fresh.call("accumulate", words(1)) == words(6)


def test_sessions_and_plain_calls_interleave_correctly(sport, rng):
    """Session work (inline or queued) and batched plain calls, all at once:
    every state and every result as the host computes it."""
    sessions = [sport.session_open() for _ in range(4)]
    sizes = [64, 1000, 20_000, 100]  # words: small ones run inline, 20 000 queues
    starts = [rng.integers(0, 2**32, n, dtype=np.uint32) for n in sizes]
    for s, start in zip(sessions, starts):
        s.create("acc", start.tobytes())
    expected = [start.copy() for start in starts]
    plain, plain_expected, session_calls = [], [], []
    for _ in range(15):
        for i, s in enumerate(sessions):
            step = rng.integers(0, 2**32, sizes[i], dtype=np.uint32)
            expected[i] = expected[i] + step
            session_calls.append(sport.call_async("session_call", s.ref, "accumulate", step.tobytes(), {"output_size": 0}))
        data = rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes()
        plain.append(sport.call_async("execute_kernel", b"double", data, 1))
        plain_expected.append(reference.double(data, len(data)))
    assert [f.result(60) for f in session_calls] == [b""] * len(session_calls)
    assert [f.result(60) for f in plain] == plain_expected
    for s, want in zip(sessions, expected):
        assert np.array_equal(np.frombuffer(s.read("acc"), "<u4"), want)
        s.close()

