"""Per-request budgets (issue 24, item 5), through a real port: a chain's
bytes and dispatch sizes count against one request's budget, and the
reader never runs a kernel that can hold it (docs/sessions.md,
docs/executor.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from conftest import start_port, stat, until_inline

from kem_port.wire import terms
from kem_port.client import PortClient, PortError
from kem_port.client import _step_term  # the chain step's wire form, as PortClient.chain sends it

MiB = 1 << 20


@contextmanager
def port_killed_after(**env: str) -> Iterator[PortClient]:
    """A port that is killed, not asked to stop, when the test ends: a
    runaway kernel may still hold its GPU thread."""
    port = start_port(**env)
    try:
        yield port
    finally:
        port.proc.kill()
        port.proc.wait(10)


def pool_in_use(port: PortClient) -> int:
    return stat(port, "pool_live_bytes") - stat(port, "pool_idle_bytes")


def chain_async(port: PortClient, steps: list[dict], data: bytes = b""):
    return port.call_async("chain", terms.atom("undefined"), [_step_term(s) for s in steps], {"input": data})


def doubled(words: np.ndarray, times: int) -> bytes:
    return (words * np.uint32(2**times)).tobytes()


# -- chain dispatch sizes ----------------------------------------------------

def test_a_chain_step_with_a_huge_explicit_dispatch_is_refused_naming_the_step(rng):
    """The red team's 87-byte body: workgroups {65535, 65535, 64} held the
    port until the caller's timeout restarted it, every time."""
    with port_killed_after() as port:
        words = rng.integers(0, 2**31, 64, dtype=np.uint32)
        started = time.perf_counter()
        pending = chain_async(port, [{"kernel": "double"}, {"kernel": "double", "workgroups": (65535, 65535, 64)}], words.tobytes())
        with pytest.raises(PortError) as err:
            pending.result(10)
        took = time.perf_counter() - started
        assert (err.value.reason, err.value.step) == ("bad_args", 2), err.value
        assert "workgroups" in err.value.detail and "274" in err.value.detail  # the step's total, 65535*65535*64
        assert took < 6.0  # refused, not run: running it held the port past the 10 s timeout
        assert port.call("ping") is not None
        for n in (1, 300, 4096):
            words = rng.integers(0, 2**31, n, dtype=np.uint32)
            assert port.chain([{"kernel": "double"}, {"kernel": "double"}], input=words.tobytes()) == doubled(words, 2)


def test_an_explicit_dispatch_within_the_bound_runs(rng):
    with start_port() as port:
        words = rng.integers(0, 2**31, 1024, dtype=np.uint32)
        out = port.chain([{"kernel": "double", "workgroups": (4, 1, 1)}], input=words.tobytes())
        assert out == doubled(words, 1)


def test_a_chain_of_many_large_dispatches_is_bounded_in_total():
    """Each step within the per-step bound, the chain over the total bound:
    refused at the step that crosses it, before anything ran."""
    with start_port(KEM_MAX_OUTPUT_BYTES=str(1 * MiB)) as port:
        # 1 MiB of output is 262,144 words: 1024 groups of double's 256 per step.
        step = {"kernel": "double", "workgroups": (1024, 1, 1), "output_size": 4096}
        with pytest.raises(PortError) as err:
            port.chain([step] * 20, input=bytes(4096))
        assert err.value.reason == "bad_args" and err.value.step == 17, err.value
        assert "chain" in err.value.detail
        assert port.chain([step] * 16, input=bytes(4096)) == bytes(4096)


# -- chain bytes -----------------------------------------------------------

def test_a_chains_temporaries_count_against_one_request_budget(rng):
    """64 steps of 16 MiB each grew the port by 1 GB: every step was within
    the output budget, the chain was not."""
    with start_port(KEM_MAX_OUTPUT_BYTES=str(16 * MiB)) as port:
        before = pool_in_use(port), stat(port, "pool_live_bytes")
        steps = [{"kernel": "double", "output": f"t{i}", "output_size": 16 * MiB, "input": "t0" if i else None} for i in range(64)]
        steps = [{k: v for k, v in s.items() if v is not None} for s in steps]
        with pytest.raises(PortError) as err:
            port.chain(steps, input=bytes(64))
        assert err.value.reason == "too_large" and err.value.step == 2, err.value
        assert str(32 * MiB) in err.value.detail and str(16 * MiB) in err.value.detail  # the total and the budget
        assert (pool_in_use(port), stat(port, "pool_live_bytes")) == before  # refused before allocating
        # Within the budget a chain of many steps runs, and is right.
        for n in (1, 777, 4096):
            words = rng.integers(0, 2**20, n, dtype=np.uint32)
            assert port.chain([{"kernel": "double"}] * 8, input=words.tobytes()) == doubled(words, 8)


# -- the reader never runs a kernel that can hold it -------------------------

# xorshift32 stepped 64 x input[1] times per word (an LCG's steps the
# compiler folds into one). lavapipe (gallivm) stops a shader's loops after
# 65,535 iterations in all, so the work is in the loop's body: 65,535 x 64
# steps for each of 4,096 words run for a minute or more there.
UNROLLED = 64
SPIN = """@group(0) @binding(0) var<storage, read> input: array<u32>;
@group(0) @binding(1) var<storage, read_write> output: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= arrayLength(&output)) { return; }
    var x = input[2] + gid.x;
    for (var i = 0u; i < input[1]; i++) {
""" + "        x ^= x << 13u; x ^= x >> 17u; x ^= x << 5u;\n" * UNROLLED + """    }
    output[gid.x] = x;
}
"""
SPIN_HINT = 1024  # 16 input bytes -> 16 KiB out: 4,096 invocations, a small call
# A runaway on any adapter: lavapipe stops at its 65,535 iterations (a minute
# or more), a GPU would take hours (an H200 ran 65,535 rounds in well under
# the tests' 0.3 s).
RUNAWAY = 0xFFFFFFFF


def spin_reference(rounds: int, seed: int, words: int) -> bytes:
    x = (np.uint64(seed) + np.arange(words, dtype=np.uint64)) & np.uint64(0xFFFFFFFF)
    for _ in range(rounds * UNROLLED):
        x ^= (x << np.uint64(13)) & np.uint64(0xFFFFFFFF)
        x ^= x >> np.uint64(17)
        x ^= (x << np.uint64(5)) & np.uint64(0xFFFFFFFF)
    return x.astype("<u4").tobytes()


def spin_input(rounds: int, seed: int) -> bytes:
    return np.array([0, rounds, seed, 0], dtype="<u4").tobytes()


def send_spin(port: PortClient, road: str, data: bytes, session=None):
    """A lone small execute_kernel frame (the folded road) or a one-step
    chain (session work the reader may run inline)."""
    req_id = port.next_req_ids(1)[0]
    if road == "call":
        request = port._request(req_id, "execute_kernel", (b"spin", data, SPIN_HINT), 600_000)
    else:
        step = _step_term({"kernel": "spin", "output_size": 16 * SPIN_HINT})
        request = port._request(req_id, "chain", (terms.atom("undefined"), [step], {"input": data}), 600_000)
    return req_id, port.call_raw_frame(terms.encode(request), [req_id])[0]


def answered_within(port: PortClient, method: str, *args) -> tuple[object, float]:
    started = time.perf_counter()
    value = port.call_async(method, *args).result(30)
    return value, time.perf_counter() - started


@pytest.mark.parametrize("road", ["call", "chain"])
def test_a_runaway_warm_kernel_never_holds_the_reader(kernel_dir, rng, road):
    """The red team's small warm call ran inline on the reader: the pipe
    filled, the owner could neither probe nor kill. A kernel with a loop
    now queues to the GPU thread, so ping and call_state are answered."""
    (kernel_dir / "spin.wgsl").write_text(SPIN)
    with port_killed_after(KEM_KERNEL_DIR=str(kernel_dir)) as port:
        for _ in range(2):  # compiled, then warm: today's inline road would take the next one
            seed = int(rng.integers(0, 2**31))
            _, warm = send_spin(port, road, spin_input(3, seed))
            assert warm.result(60) == spin_reference(3, seed, 16 * SPIN_HINT // 4)
        runaway_id, runaway = send_spin(port, road, spin_input(RUNAWAY, 7))
        time.sleep(0.3)  # it is running
        assert not runaway.done()
        pong, took = answered_within(port, "ping")
        assert took < 1.0, f"ping took {took:.2f} s"
        state, took = answered_within(port, "call_state", runaway_id)
        assert took < 1.0, f"call_state took {took:.2f} s"
        # A chain is placed as a call is (its control action carries its
        # ReqId): the node blames only work the GPU was inside.
        assert terms.binary_bytes({terms.atom_name(k): v for k, v in state.items()}["state"]) == b"running"
        if road == "chain":
            queued_id, _ = send_spin(port, road, spin_input(3, 1))
            state, _ = answered_within(port, "call_state", queued_id)
            assert terms.binary_bytes({terms.atom_name(k): v for k, v in state.items()}["state"]) == b"queued"


def test_a_loop_free_warm_call_still_runs_inline(rng):
    with start_port() as port:
        for n in (16, 1000, 4096):
            words = rng.integers(0, 2**31, n, dtype=np.uint32)
            port.call("execute_kernel", b"double", words.tobytes(), 1)  # warm the shape
            until_inline(port, "inline_calls", lambda: port.call("execute_kernel", b"double", words.tobytes(), 1))
            before = stat(port, "inline_calls")
            assert port.call("execute_kernel", b"double", words.tobytes(), 1) == doubled(words, 1)
            assert stat(port, "inline_calls") == before + 1


def test_a_chains_max_bytes_bounds_its_bytes_and_work_below_the_ports(rng):
    """max_bytes (the node's request budget, kem:request_chain_usage/2)
    counts the planned chain: a step's output, and a dispatch's
    invocations, past it are refused naming the node's budget; within it
    the chain runs; a budget over the port's own is the port's."""
    with port_killed_after() as port:
        words = rng.integers(0, 2**31, 64, dtype=np.uint32)

        def chain(steps, max_bytes):
            return port.call("chain", terms.atom("undefined"), steps, {"input": words.tobytes(), "max_bytes": max_bytes})

        assert chain([{"kernel": "double"}], 256) == doubled(words, 1)
        with pytest.raises(PortError) as err:  # 256 B in, 512 B made: over a 300-byte budget
            chain([{"kernel": "double", "output_size": 512}], 300)
        assert err.value.reason == "too_large" and "request_max_output_bytes" in err.value.detail
        # 16,384 workgroups of 256 invocations: 4M invocations, over what a 64 KiB budget allows (16,384)
        with pytest.raises(PortError) as err:
            chain([{"kernel": "double", "workgroups": (16384, 1, 1)}], 65536)
        assert err.value.reason == "bad_args" and "workgroups" in err.value.detail
        assert chain([{"kernel": "double", "workgroups": (64, 1, 1)}], 65536) == doubled(words, 1)
        assert chain([{"kernel": "double"}], 1 << 62) == doubled(words, 1)  # the port's own budget
        for bad in (-1, 1.5, b"4"):
            with pytest.raises(PortError) as err:
                chain([{"kernel": "double"}], bad)
            assert err.value.reason == "bad_args" and "max_bytes" in err.value.detail
