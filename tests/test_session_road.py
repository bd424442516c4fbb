"""The road a session step or chain takes (docs/sessions.md, "The road a
step takes"): a short loop-free step runs on the reader, and a step whose
dispatch, loop or bytes make it long runs on the GPU thread, each answered
with values checked against numpy on fresh random data, through a real port."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import start_port, until_inline

from kem_port.wire import terms

KERNELS = str(Path(__file__).resolve().parent / "session_kernels")


@pytest.fixture(scope="module")
def sport():
    with start_port(KEM_KERNEL_DIR=KERNELS) as client:
        yield client


def counters(port) -> dict:
    return {terms.atom_name(k): v for k, v in port.call("stats").items()}


def moved(port, before: dict, *names: str) -> tuple[int, ...]:
    after = counters(port)
    return tuple(after.get(n, 0) - before.get(n, 0) for n in names)


@pytest.mark.parametrize("n", [16, 1000, 4000])
def test_small_resident_steps_run_on_the_reader(sport, rng, n):
    start = rng.integers(0, 2**32, n, dtype=np.uint32)
    s = sport.session_open()
    s.create("acc", start.tobytes())
    s.call("accumulate", bytes(4), output_size=0)  # compiled first: a compile never runs on the reader
    until_inline(sport, "inline_session_calls", lambda: s.call("accumulate", bytes(4), output_size=0))  # adds 0
    before, expected = counters(sport), start.copy()
    for _ in range(12):
        step = rng.integers(0, 2**32, int(rng.integers(1, n + 1)), dtype=np.uint32)
        expected = expected + np.resize(step, n)  # acc[i] += input[i mod len(input)], u32 wrap
        assert s.call("accumulate", step.tobytes(), output_size=0) == b""
    assert moved(sport, before, "inline_session_calls", "session_calls_off_reader") == (12, 0)
    assert np.array_equal(np.frombuffer(s.read("acc"), "<u4"), expected)
    s.close()


@pytest.mark.parametrize("n", [1, 333, 1024])  # 11 buffers of 4n bytes: within 64 KiB
def test_small_chains_run_on_the_reader(sport, rng, n):
    data = rng.integers(0, 2**32, n, dtype=np.uint32)
    steps = [{"kernel": "double"}] * 10
    sport.chain(steps, input=data.tobytes())
    until_inline(sport, "inline_session_calls", lambda: sport.chain(steps, input=data.tobytes()))
    before = counters(sport)
    for _ in range(3):
        data = rng.integers(0, 2**32, n, dtype=np.uint32)
        out = np.frombuffer(sport.chain(steps, input=data.tobytes()), "<u4")
        assert np.array_equal(out, data * np.uint32(1024))
    assert moved(sport, before, "inline_session_calls", "session_calls_off_reader") == (3, 0)


@pytest.mark.parametrize("groups", [1024, 4096])
def test_a_wide_dispatch_leaves_the_reader(sport, rng, groups):
    """A 4-byte step on a 4 KB state whose workgroups the caller sets past a
    lone call's work (64 x 1024 invocations > 16,384) runs on the GPU thread:
    on the reader, {4096, 256, 1} would hold ping and call_state for as long
    as the GPU runs it."""
    start = rng.integers(0, 2**32, 1024, dtype=np.uint32)
    s = sport.session_open()
    s.create("acc", start.tobytes())
    s.call("accumulate", bytes(4), output_size=0)
    one = rng.integers(0, 2**32, 1, dtype=np.uint32)
    before = counters(sport)
    assert s.call("accumulate", one.tobytes(), output_size=0, workgroups=(groups, 1, 1)) == b""
    assert moved(sport, before, "inline_session_calls", "session_calls_off_reader") == (0, 1)
    assert np.array_equal(np.frombuffer(s.read("acc"), "<u4"), start + one[0])
    s.close()


def test_a_looping_kernel_never_runs_on_the_reader(sport, rng):
    """spin loops until its input's word 0 is 12345: given it, no turn is
    taken; still a kernel that may loop, so it stays on the GPU thread."""
    data = np.array([12345] + list(rng.integers(0, 2**32, 15, dtype=np.uint32)), dtype="<u4")
    sport.chain([{"kernel": "spin"}], input=data.tobytes())
    before = counters(sport)
    out = sport.chain([{"kernel": "spin"}], input=data.tobytes())
    assert np.array_equal(np.frombuffer(out, "<u4"), np.zeros(16, "<u4"))
    assert moved(sport, before, "inline_session_calls") == (0,)


def test_a_large_state_stays_off_the_reader(sport, rng):
    n = 32 * 1024  # 128 KiB of state: over a lone call's 64 KiB
    start = rng.integers(0, 2**32, n, dtype=np.uint32)
    s = sport.session_open()
    s.create("acc", start.tobytes())
    step = rng.integers(0, 2**32, 8, dtype=np.uint32)
    s.call("accumulate", step.tobytes(), output_size=0)
    before = counters(sport)
    s.call("accumulate", step.tobytes(), output_size=0)
    assert moved(sport, before, "inline_session_calls") == (0,)
    assert np.array_equal(np.frombuffer(s.read("acc"), "<u4"), start + 2 * np.resize(step, n))
    s.close()


def words(*values: int) -> bytes:
    return np.array(values, dtype="<u4").tobytes()


@pytest.mark.parametrize("rows, cols, kept", [(1, 3, True), (13, 37, True), (40, 100, False)])
def test_a_repeat_runs_on_its_kit_with_each_calls_bytes(sport, rng, rows, cols, kept):
    """A chain's shape asked again runs on the kit its first run built: new
    uniforms, own buffers and input each time, values against numpy. One
    whose buffers pass a lone call's 64 KiB (40 x 100: b, c, e and c, e
    read back, 80 KB) is planned every time."""
    s = sport.session_open()
    a = rng.integers(0, 2**32, rows * cols, dtype=np.uint32)
    s.create("a", a.tobytes())
    before = counters(sport)
    for _ in range(4):
        b = rng.integers(0, 2**32, rows * cols, dtype=np.uint32)
        steps = [{"kernel": "add_grid", "buffers": {"b": b.tobytes(), "shape": words(rows, cols)},
                  "outputs": {"c": rows * cols * 4}, "grid": (cols, rows, 1)},
                 {"kernel": "add_grid", "buffers": {"shape": words(rows, cols)}, "bind": {"b": "c", "c": "e"},
                  "outputs": {"e": rows * cols * 4}, "grid": (cols, rows, 1)}]
        assert s.chain(steps, returns=["c", "e"]) == {"c": (a + b).tobytes(), "e": (a + a + b).tobytes()}
    assert moved(sport, before, "chain_kits_built", "chain_kit_runs") == ((1, 4) if kept else (0, 0))
    # A uniform that changes every call (axpy's k) is packed anew every call.
    x, y = (rng.integers(0, 2**32, rows * cols, dtype=np.uint32) for _ in range(2))
    s.create("x", x.tobytes())
    s.create("y", y.tobytes())
    for _ in range(3):
        k = int(rng.integers(1, 2**32))
        s.call("axpy_named", buffers={"params": words(rows * cols, k)}, grid=(rows * cols, 1, 1))
        y = y + np.uint32(k) * x
    assert np.array_equal(np.frombuffer(s.read("y"), "<u4"), y)
    s.close()


def test_outputs_are_cleared_on_every_run_of_a_kit(sport, rng):
    """add_grid writes c only inside its uniform's shape: a call with fewer
    rows than the last must read zeros past them, never the last call's sums."""
    s = sport.session_open()
    rows, cols = 6, 10
    a = rng.integers(0, 2**32, rows * cols, dtype=np.uint32)
    s.create("a", a.tobytes())
    for live in (rows, 1, rows, 3, 2):
        b = rng.integers(0, 2**32, rows * cols, dtype=np.uint32)
        got = s.call("add_grid", buffers={"b": b.tobytes(), "shape": words(live, cols)},
                     outputs={"c": rows * cols * 4}, grid=(cols, rows, 1))
        expected = np.where(np.arange(rows * cols) < live * cols, a + b, 0).astype("<u4")
        assert got == {"c": expected.tobytes()}
    s.close()


def test_a_kit_follows_its_sessions_buffers(sport, rng):
    """Buffers created or freed since a kit was built: the next call plans
    anew. An `output` name that was a temporary becomes, once the session
    has a buffer of that name, that buffer, written in place."""
    s = sport.session_open()
    acc = rng.integers(0, 2**32, 64, dtype=np.uint32)
    s.create("acc", acc.tobytes())
    step = rng.integers(0, 2**32, 64, dtype=np.uint32)
    chain = [{"kernel": "accumulate", "output": "o"}]
    for _ in range(2):
        acc = acc + step
        assert s.chain(chain, step.tobytes(), returns=["o"]) == {"o": acc.tobytes()}
    s.create("o", 64 * 4)
    acc = acc + step
    assert s.chain(chain, step.tobytes(), returns=["o"]) == {"o": acc.tobytes()}
    assert s.read("o") == acc.tobytes()  # the session's own buffer this time
    s.free("acc")
    fresh = rng.integers(0, 2**32, 64, dtype=np.uint32)
    s.create("acc", fresh.tobytes())
    assert s.chain(chain, step.tobytes(), returns=["o"]) == {"o": (fresh + step).tobytes()}
    s.close()


def test_two_sessions_with_one_shape_never_share_a_kit(sport, rng):
    sessions = [sport.session_open() for _ in range(2)]
    states = [rng.integers(0, 2**32, 32, dtype=np.uint32) for _ in sessions]
    for s, state in zip(sessions, states):
        s.create("acc", state.tobytes())
    for _ in range(3):
        for i, s in enumerate(sessions):
            step = rng.integers(0, 2**32, 32, dtype=np.uint32)
            states[i] = states[i] + step
            assert s.call("accumulate", step.tobytes()) == states[i].tobytes()
    for s in sessions:
        s.close()


def test_a_changed_kernel_file_is_never_run_from_an_old_kit(tmp_path, rng):
    kernel = (Path(KERNELS).parent.parent / "kem_port" / "kernels" / "double.wgsl").read_text()
    (tmp_path / "twice.wgsl").write_text(kernel)
    with start_port(KEM_KERNEL_DIR=str(tmp_path)) as port:
        data = rng.integers(0, 2**32, 64, dtype=np.uint32)
        for _ in range(3):
            assert port.chain([{"kernel": "twice"}] * 2, input=data.tobytes()) == (data * np.uint32(4)).tobytes()
        (tmp_path / "twice.wgsl").write_text(kernel.replace("* 2u", "* 3u"))
        assert port.chain([{"kernel": "twice"}] * 2, input=data.tobytes()) == (data * np.uint32(9)).tobytes()


def test_closing_a_session_drops_its_kits(sport, rng):
    s = sport.session_open()
    s.create("acc", 256)
    for _ in range(2):
        s.call("accumulate", rng.integers(0, 2**32, 4, dtype=np.uint32).tobytes())
    held = counters(sport)["chain_kits"]
    s.close()
    assert counters(sport)["chain_kits"] == held - 1


@pytest.mark.parametrize("n", [2, 65, 700])
def test_a_kits_usage_carries_what_it_launched(sport, rng, n):
    """accumulate is loop-free: its gas is the invocations launched, one
    workgroup of 64 per 64 output words, on the first run and on its kit."""
    s = sport.session_open()
    acc = rng.integers(0, 2**32, n, dtype=np.uint32)
    s.create("acc", acc.tobytes())
    before = counters(sport)
    for _ in range(3):
        step = rng.integers(0, 2**32, n, dtype=np.uint32)
        acc = acc + step
        out, usage = s.call("accumulate", step.tobytes(), usage=True)
        assert terms.binary_bytes(out) == acc.tobytes()
        assert {terms.atom_name(k): v for k, v in usage.items()} == {"gas": -(-n // 64) * 64}
    assert moved(sport, before, "chain_kit_runs") == (3,)
    s.close()
