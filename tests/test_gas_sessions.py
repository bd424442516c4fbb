"""Gas on sessions and chains (issue 27, docs/metering.md "Sessions and
chains"): every session call and chain step of a looping kernel runs its
gas form with a cap and a meter of its own; a step that runs out fails the
chain with gas_exhausted naming the step, the port and the session go on.
Real wgpu, the real port process; outputs against numpy on fresh data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import start_port

from kem_port.client import PortError, plain
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.executor import Executor
from kem_port.gpu.session.chain_steps import Chain, ClearStep, CopyStep, Step, StepError
from kem_port.gpu.session.session_service import SessionService
from kem_port.kernel_store import default_stores, source_from_bytes
from kem_port.stats import Stats
from kem_port.wire.terms import binary_bytes

# out[i] = 0 + 1 + ... + (in[i] - 1): in[i] loop iterations per invocation.
COUNTING = (Path(__file__).resolve().parents[1] / "tests" / "gas_kernels" / "counting.wgsl").read_bytes()  # one text for pytest and eunit
# Spins until a word no one writes changes: only its budget ends it.
SPIN = b"""
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = 0u;
  while (inp[0] != 12345u) { x += 1u; }
  out[g.x] = x;
}
"""
# A barrier in a loop that never ends: its count must break it uniformly.
BARRIER_SPIN = b"""
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
var<workgroup> shared_word: u32;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>,
                                     @builtin(local_invocation_index) l: u32) {
  var rounds = 0u;
  loop {
    if (l == 0u) { shared_word = rounds; }
    workgroupBarrier();
    if (inp[0] == 12345u) { break; }
    rounds += 1u;
    workgroupBarrier();
  }
  out[g.x] = rounds + shared_word;
}
"""
# Not kem@1.0-shaped: a uniform at group 0, its buffers at group 1, so the
# gas group is 2. stop == 1: y[i] = 0 + ... + (x[i] - 1); stop == 0: runs away.
NAMED_G1 = b"""
struct P { n: u32, stop: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(1) @binding(0) var<storage, read> x: array<u32>;
@group(1) @binding(1) var<storage, read_write> y: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= p.n) { return; }
  var acc = 0u;
  var k = 0u;
  loop {
    if (p.stop == 1u && k >= x[g.x]) { break; }
    acc += k;
    k += 1u;
  }
  y[g.x] = acc;
}
"""
# Groups 0 and 2: the gas group is the lowest the kernel leaves free, 1, between them.
NAMED_G2 = NAMED_G1.replace(b"@group(1)", b"@group(2)")
KERNELS = {"counting": COUNTING, "spin": SPIN, "barrier_spin": BARRIER_SPIN, "named_g1": NAMED_G1, "named_g2": NAMED_G2,
           "life": (Path(__file__).resolve().parent / "session_kernels" / "life.wgsl").read_bytes()}
NODE_LIMIT = 64 * 5000


def words(values) -> bytes:
    return np.asarray(values, dtype="<u4").tobytes()


def triangle(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.uint64)
    return (v * (v - 1) // 2).astype(np.uint32)


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    root = tmp_path_factory.mktemp("gas_sessions")
    for name, text in KERNELS.items():
        (root / f"{name}.wgsl").write_bytes(text)
    with start_port(KEM_KERNEL_DIR=str(root), KEM_GAS_LIMIT=str(NODE_LIMIT)) as client:
        yield client


@pytest.fixture
def session(port):
    s = port.session_open()
    yield s
    try:
        s.close()
    except PortError:
        pass


def chain(port, session, steps: list[dict], returns: list[str] | None = None, **opts):
    """A chain with options the client's chain() does not take (gas_limit)."""
    if returns is not None:
        opts["return"] = returns
    got = port.call("chain", session.ref, steps, opts)
    if isinstance(got, dict):  # buffer names as str, contents as bytes (as PortSession.chain gives them)
        return {binary_bytes(k).decode(): binary_bytes(v) for k, v in got.items()}
    return got


def exhausted(run) -> PortError:
    with pytest.raises(PortError) as caught:
        run()
    assert caught.value.reason == "gas_exhausted", caught.value
    return caught.value


@pytest.mark.parametrize("kernel", ["spin", "barrier_spin"])
def test_a_runaway_session_call_ends_by_budget_and_the_session_goes_on(port, session, rng, kernel):
    pid = port.proc.pid
    data = rng.integers(0, 40, 64, dtype=np.uint32)
    session.create("state", data.tobytes())
    error = exhausted(lambda: session.call(kernel, bytes(256), output_size=256, gas_limit=64 * 1000))
    assert error.step is None  # a session call is one step: a plain {Reason, Detail}
    # 64 invocations, each capped at (64000 - 64) // 64 = 999 iterations
    assert "of limit 64000" in error.detail and "999 loop iterations" in error.detail, error.detail
    error = exhausted(lambda: session.call(kernel, bytes(256), output_size=256))
    assert f"of limit {NODE_LIMIT}" in error.detail  # the node's KEM_GAS_LIMIT without the option
    assert session.call("counting", data.tobytes(), output_size=256) == triangle(data).tobytes()
    assert session.read("state") == data.tobytes()  # the session's buffers untouched
    assert port.proc.pid == pid and port.proc.poll() is None


@pytest.mark.parametrize("runaway", ["spin", "barrier_spin"])
def test_a_runaway_chain_step_is_named_and_earlier_steps_writes_stay(port, session, rng, runaway):
    pid = port.proc.pid
    a = rng.integers(0, 30, 64, dtype=np.uint32)
    session.create("a", a.tobytes())
    session.create("b", 256)
    steps = [{"kernel": "counting", "input": "a", "output": "b"},
             {"copy": ("b", 0, "a", 0, 256)},
             {"kernel": runaway, "input": "a", "output_size": 256},
             {"kernel": "counting", "input": "b"}]
    error = exhausted(lambda: chain(port, session, steps, ["b"], gas_limit=100_000))
    assert error.step == 3 and "of limit 100000" in error.detail, (error.step, error.detail)
    # One submission ran whole: step 1's output and step 2's copy stay (docs/metering.md).
    assert session.read("b") == triangle(a).tobytes()
    assert session.read("a") == triangle(a).tobytes()
    # The same session, the next chain right, the same process.
    good = [steps[0], {"kernel": "counting", "input": "a", "output": "c"}]
    c = triangle(triangle(a) % 64)
    session.write("a", 0, a.tobytes())
    session.write("b", 0, (triangle(a) % 64).tobytes())
    got = chain(port, session, [{"kernel": "counting", "input": "b", "output": "c", "output_size": 256}], ["c"])
    assert got == {"c": c.tobytes()}
    assert chain(port, session, good[:1], ["b"]) == {"b": triangle(a).tobytes()}
    assert port.proc.pid == pid and port.proc.poll() is None


@pytest.mark.parametrize("kernel", ["named_g1", "named_g2"])
@pytest.mark.parametrize("n", [1, 64, 1000])
def test_a_by_name_kernel_at_groups_0_and_1_or_2_is_metered_at_its_free_group(port, session, rng, n, kernel):
    x = rng.integers(0, 50, n, dtype=np.uint32)
    session.create("x", x.tobytes())
    session.create("y", 4 * n)
    step = {"kernel": kernel, "grid": (n, 1, 1)}
    assert session.call(kernel, buffers={"p": words([n, 1])}, grid=(n, 1, 1)) == {}
    assert session.read("y") == triangle(x).tobytes()
    error = exhausted(lambda: chain(port, session, [dict(step, buffers={"p": words([n, 1])}),
                                                    dict(step, buffers={"p": words([n, 0])})], ["y"]))
    assert error.step == 2, error
    assert chain(port, session, [dict(step, buffers={"p": words([n, 1])})], ["y"]) == {"y": triangle(x).tobytes()}


def test_the_chains_limit_is_shared_by_every_invocation_of_its_steps(port, session, rng):
    """Hand count at the edge: two counting steps of 64 invocations share
    one limit L; each invocation's cap is (L - 128) // 128, so a step whose
    largest input is m runs with L = 128 + 128 m and runs out at one less."""
    m = 23
    first = rng.integers(0, m, 64, dtype=np.uint32)  # below m: step 1 fits either way
    second = rng.integers(0, m + 1, 64, dtype=np.uint32)
    second[int(rng.integers(0, 64))] = m
    session.create("u", first.tobytes())
    session.create("v", second.tobytes())
    steps = [{"kernel": "counting", "input": "u", "output": "p"}, {"kernel": "counting", "input": "v", "output": "q"}]
    got = session.chain(steps, returns=["p", "q"], gas_limit=128 + 128 * m)  # the client's chain takes it too
    assert got == {"p": triangle(first).tobytes(), "q": triangle(second).tobytes()}
    error = exhausted(lambda: chain(port, session, steps, ["p", "q"], gas_limit=128 + 128 * m - 1))
    assert error.step == 2 and f"its {m - 1} loop iterations" in error.detail, error
    error = exhausted(lambda: chain(port, session, steps, ["p"], gas_limit=127))  # less than launching
    assert error.step == 2 and "needs 128" in error.detail, error
    # A loop-free chain is checked against its own limit as a loop-free call is:
    # double's 64 words are one workgroup of 256 invocations.
    error = exhausted(lambda: chain(port, session, [{"kernel": "double"}], input=bytes(256), gas_limit=255))
    assert error.step == 1 and "needs 256" in error.detail, error
    assert chain(port, session, [{"kernel": "double"}], input=words(range(64)), gas_limit=256) == words(range(0, 128, 2))


@pytest.mark.parametrize("bad, reason", [(0, "bad_args"), (-1, "bad_args"), (b"100", "bad_args"), (1 << 63, "too_large")])
def test_a_bad_gas_limit_is_refused_as_executes_is(port, session, bad, reason):
    with pytest.raises(PortError) as caught:
        session.call("counting", bytes(256), gas_limit=bad)
    assert caught.value.reason == reason and "gas_limit" in caught.value.detail
    with pytest.raises(PortError) as caught:
        chain(port, session, [{"kernel": "counting"}], input=bytes(256), gas_limit=bad)
    assert caught.value.reason == reason and "gas_limit" in caught.value.detail


# -- the gas a chain used, in-process (the count the usage carrier reports) --


@pytest.fixture(scope="module")
def service():
    executor = Executor(Config(), Stats())
    executor.open()
    return SessionService(executor, Config(), Stats())


def source(name: str):
    return source_from_bytes(name, KERNELS[name], "test", "local")


@pytest.mark.parametrize("words_n", [64, 200])
def test_hand_counted_gas_of_a_small_looping_chain_copies_and_clears_count_0(service, rng, words_n):
    double = default_stores(None)[0].lookup("double")
    v = rng.integers(0, 20, words_n, dtype=np.uint32)
    size = 4 * words_n
    steps = (Step(source("counting"), output="t"),  # ceil(n / 64) workgroups of 64; sum(v) iterations
             Step(source("counting"), input="t", output="s", output_size=size),  # sum(t) iterations
             CopyStep("s", 0, "t", 0, size),  # no invocation: 0 gas
             ClearStep("t", 0, 4),  # 0 gas
             Step(double, input="s", output="d"),  # loop-free: its invocations only
             Step(source("counting"), input="t", output_size=size))  # sum(t2) iterations
    result = service.run(lambda: service.chains.run(Chain(steps, v.tobytes(), ("t", "s", "d"), None)))
    t = triangle(v)
    s = triangle(t)
    t2 = s.copy()
    t2[0] = 0
    assert result.value == {"t": t2.tobytes(), "s": s.tobytes(), "d": (s * np.uint32(2)).tobytes()}
    launched = 64 * -(-words_n // 64)
    double_launched = 256 * -(-words_n // 256)  # double.wgsl: @workgroup_size(256), one word each
    iterations = int(v.sum()) + int(t.astype(np.uint64).sum()) + int(t2.astype(np.uint64).sum())
    assert result.gas == 3 * launched + double_launched + iterations


def test_a_runaway_step_in_process_names_its_index(service):
    steps = (Step(source("counting")), Step(source("spin")), Step(source("counting")))
    with pytest.raises(StepError) as caught:
        service.run(lambda: service.chains.run(Chain(steps, bytes(256), None, None, gas_limit=64 * 3 * 100)))
    assert caught.value.reason == "gas_exhausted" and caught.value.step == 1


def test_usage_true_answers_the_gas_beside_the_result(port, session, rng):
    """The execute road's carrier ({Result, #{gas => G}}, port/replies.with_gas) on a
    session call and a chain; hand counts: 64 invocations + sum(in) iterations each
    counting step; double (loop-free) its 256 invocations."""
    data = rng.integers(0, 50, 64, dtype=np.uint32)
    value, usage = port.call("session_call", session.ref, "counting", data.tobytes(), {"output_size": 256, "usage": True})
    assert binary_bytes(value) == triangle(data).tobytes() and plain(usage) == {"gas": 64 + int(data.sum())}
    assert session.call("counting", data.tobytes(), output_size=256) == triangle(data).tobytes()  # not asked: as before
    steps = [{"kernel": "counting"}, {"copy": ("x", 0, "y", 0, 4)}, {"kernel": "double", "output_size": 256},
             {"kernel": "counting", "input": "x", "output": "z", "output_size": 256}]
    x = rng.integers(0, 30, 64, dtype=np.uint32)
    session.create("x", x.tobytes())
    session.create("y", 4)
    value, usage = port.call("chain", session.ref, steps, {"input": data.tobytes(), "return": ["z"], "usage": True})
    assert {binary_bytes(k).decode(): binary_bytes(v) for k, v in value.items()} == {"z": triangle(x).tobytes()}
    assert plain(usage) == {"gas": (64 + int(data.sum())) + 256 + (64 + int(x.sum()))}
    with pytest.raises(PortError) as caught:
        port.call("chain", session.ref, steps, {"input": data.tobytes(), "usage": 1})
    assert caught.value.reason == "bad_args"


@pytest.mark.parametrize("side", [8, 32, 96])
def test_the_game_of_life_counts_13_a_cell_a_generation(port, session, rng, side):
    """life.wgsl: per cell 1 invocation + 3 outer + 9 inner iterations (docs/metering.md)."""
    grid = rng.integers(0, 2, side * side, dtype=np.uint32)
    session.create("a", grid.tobytes())
    session.create("b", grid.nbytes)
    size = words([side, side])
    steps = [{"kernel": "life", "params": size, "output_size": 0, "bind": {"cur": c, "next": n}} for c, n in (("a", "b"), ("b", "a"))]
    value, usage = port.call("chain", session.ref, steps, {"return": ["a"], "usage": True})
    cells = grid.reshape(side, side)
    for _ in range(2):
        near = sum(np.roll(np.roll(cells, dy, 0), dx, 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dx, dy) != (0, 0))
        cells = ((near == 3) | ((cells == 1) & (near == 2))).astype(np.uint32)
    assert {binary_bytes(k).decode(): binary_bytes(v) for k, v in value.items()} == {"a": cells.tobytes()}
    assert plain(usage) == {"gas": 2 * 13 * side * side}


def test_a_looping_kernel_declaring_all_four_groups_is_refused_naming_its_step(port, session, tmp_path):
    text = "".join(f"@group({g}) @binding(0) var<storage, read_write> b{g}: array<u32>;\n" for g in range(4)) + (
        "@compute @workgroup_size(1) fn main() { for (var i = 0u; i < 4u; i++) { b0[i] = b1[i] + b2[i] + b3[i]; } }\n")
    (tmp_path / "four.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(tmp_path)) as other:
        s = other.session_open()
        for g in range(4):
            s.create(f"b{g}", 16)
        with pytest.raises(PortError) as caught:
            other.call("chain", s.ref, [{"clear": ("b0", 0, 16)}, {"kernel": "four", "workgroups": (1, 1, 1)}], {})
        assert (caught.value.reason, caught.value.step) == ("bad_kernel", 2) and "all of WebGPU's 4" in caught.value.detail, caught.value


def test_a_looping_kernel_with_webgpus_8_storage_buffers_is_refused_naming_the_meter(port, tmp_path):
    """The meter is one more storage buffer in the stage (the cap one more uniform)."""
    decls = "".join(f"@group(0) @binding({i}) var<storage, read_write> b{i}: array<u32>;\n" for i in range(1, 9))
    text = ("struct P { n: u32 }\n@group(0) @binding(0) var<uniform> p: P;\n" + decls
            + "@compute @workgroup_size(1) fn main() { for (var i = 0u; i < p.n; i++) { b1[i] = "
            + " + ".join(f"b{i}[i]" for i in range(2, 9)) + "; } }\n")
    (tmp_path / "eight.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(tmp_path)) as other:
        s = other.session_open()
        for i in range(1, 9):
            s.create(f"b{i}", 16)
        with pytest.raises(PortError) as caught:
            s.call("eight", buffers={"p": words([4, 0, 0, 0])}, grid=(1, 1, 1))
        assert caught.value.reason == "bad_kernel" and "gas meter" in caught.value.detail, caught.value
