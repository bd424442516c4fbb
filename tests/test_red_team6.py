"""Red team 6: strangers' calls gathered into one dispatch (the slot form of
a group frame), attacked by hostile kernels through the real port, and the
port's work budget read right after the last reply of every failure road.

A grouped call must give what it gives alone and what numpy says for ITS
OWN input: stray writes past its output are dropped, reads past its input
or output are zero (robust access, docs/dispatch.md "the slot form")."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import kernels_port, start_port, stat
from kem_port.client import PortError
from kem_port.wire import terms

HEAD = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
"""

# Invocation 0 writes past the output, then every invocation reads past it:
# alone the read is zero; in the slot form it read the spare element where
# that stray write had landed (the call's result changed when grouped).
READ_PAST_OUTPUT = HEAD + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
    let i = gid.x;
    if (i == 0u) { dst[n + 3u] = src[0] | 1u; }
    storageBarrier();
    if (i < n) { dst[i] = src[i] ^ dst[n + 7u]; }
}
"""

# The same through a compound assignment and a wrapped i32 index.
COMPOUND_PAST = HEAD + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
    let i = gid.x;
    if (i >= n) { return; }
    dst[u32(-1 - i32(i))] += src[i];
    storageBarrier();
    dst[i] = src[i] + dst[bitcast<u32>(i32(-1))];
}
"""

# Writes past the output by every trick, through a helper function; reads
# past the input by select- and wrap-computed indexes. (An index whose byte
# offset passes 2**32 is left out: lavapipe's robust access wraps it, so
# alone src[0x80000000 + i] read src[i], its own word; grouped it reads 0.)
WRAPPING = HEAD + """
fn put(j: u32, v: u32) { dst[j] = v; }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
    let m = arrayLength(&src);
    let i = gid.x;
    if (i >= n) { return; }
    let k = src[i % m];
    put(n + (k % 1000u), 0xdeadu);
    put(0xffffffffu - i, 0xbeefu);
    dst[select(i, n + i, k % 2u == 0u)] = 0x5eedu;
    let far = src[m + (k % 4096u)] + src[u32(i32(i) - 100000)] + src[select(i % m, m + 5000u + i, k % 3u == 0u)];
    put(i, (k ^ 0x9e3779b9u) + far);
}
"""

# vec4 bindings, and an entry point that returns past the output.
VEC_HEAD = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&dst)) { return; }
"""

# Vector elements indexed by a runtime component past the vector.
VEC_COMPONENT = VEC_HEAD + """
    let v = src[i];
    dst[i] = v ^ vec4<u32>(0x01010101u);
    let j = 4u + (v.x % 1000u);
    dst[i + arrayLength(&dst)][j] = 0xabcdu;
    dst[i].w = dst[i].w + src[i + arrayLength(&src)][j];
}
"""

# Components of the spare element (a slot's last) past 3 run on into the
# NEXT slot: 4 * n of them reach that call's last output element, which it
# leaves zero, past no canary. Before the fix every neighbour's last
# element held the attacker's marks, silently.
NEXT_SLOT = VEC_HEAD + """
    let n = arrayLength(&dst);
    if (i + 1u < n) { dst[i] = src[i] ^ vec4<u32>(0x01010101u); }
    if (i < 4u) { dst[n][4u * n + i + src[0].x % 1u] = 0xabcd0000u | i; }
}
"""

# Atomics past the output land on the slot's spare element, where the
# call's own stray atomics add up: alone an atomic there reads zero, so a
# kernel that uses one's result keeps one dispatch per call ...
ATOMIC_HEAD = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<atomic<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
"""
ATOMIC_READ_PAST = ATOMIC_HEAD + """
    let i = gid.x;
    if (i >= n) { return; }
    let w = src[i] | 1u;
    atomicAdd(&dst[n + 100u], w);
    storageBarrier();
    atomicMax(&dst[i], atomicLoad(&dst[n + 100u]));
}
"""
# ... and one whose atomics are statements keeps the slot form.
ATOMIC_COUNTS = ATOMIC_HEAD + """
    if (gid.x >= n) { return; }
    let w = src[gid.x] % (n + 8u);
    atomicAdd(&dst[w], 1u);
    atomicAdd(&dst[0xffffffffu - w], 5u);
}
"""

# Workgroup memory read before it is written: another slot's workgroup
# (another caller's) may have run on the same core just before.
WORKGROUP_LEFTOVER = HEAD + """
var<workgroup> seen: array<u32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let old = seen[li];
    workgroupBarrier();
    seen[li] = src[gid.x];
    workgroupBarrier();
    if (gid.x < arrayLength(&dst)) { dst[gid.x] = src[gid.x] + old; }
}
"""

KERNELS = {"workgroup_leftover": WORKGROUP_LEFTOVER, "atomic_read_past": ATOMIC_READ_PAST, "atomic_counts": ATOMIC_COUNTS, "next_slot": NEXT_SLOT, "read_past_output": READ_PAST_OUTPUT, "compound_past": COMPOUND_PAST, "wrapping": WRAPPING, "vec_component": VEC_COMPONENT}


def expected(name: str, x: np.ndarray, out_words: int) -> np.ndarray:
    """numpy's answer for one call alone: past a binding, reads are zero
    and writes are dropped."""
    out = np.zeros(out_words, np.uint32)
    n = min(len(x), out_words)
    if name in ("read_past_output", "workgroup_leftover"):
        out[:n] = x[:n]
    elif name == "compound_past":
        out[:n] = x[:n]
    elif name == "wrapping":
        k = x[np.arange(out_words) % len(x)]
        far = np.where(k % 3 == 0, 0, x[np.arange(out_words) % len(x)]).astype(np.uint32)
        out[:] = (k ^ np.uint32(0x9E3779B9)) + far
    elif name == "atomic_counts":
        out[:] = np.bincount(x % np.uint32(out_words + 8), minlength=out_words + 8)[:out_words]
    elif name == "next_slot":
        out[: (len(x) // 4 - 1) * 4] = x[: (len(x) // 4 - 1) * 4] ^ np.uint32(0x01010101)
    elif name == "vec_component":
        out[:n] = x[:n] ^ np.uint32(0x01010101)
    return out


@pytest.fixture(scope="module")
def red_port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("red6_kernels"), KERNELS) as client:
        yield client


@pytest.mark.parametrize("name", list(KERNELS))
def test_hostile_kernels_grouped_give_each_call_its_own_answer(red_port, rng, name):
    """Groups of three input sizes sent at once (one batch, one slot
    dispatch each), each call's secret-salted input: every result is numpy's
    for its own input and equals the same call alone; no word of another
    call's input or result appears in it."""
    sizes = [(8, 12), (64, 9), (300, 17)] if "v" in name or "next" in name else [(5, 12), (64, 9), (300, 17)]
    for words, _ in sizes:  # admitted before the groups: each group is one job
        red_port.call("execute_kernel", name.encode(), np.zeros(words, np.uint32).tobytes(), 1)
    before = stat(red_port, "slot_dispatches")
    groups = []
    for words, calls in sizes:
        inputs = [rng.integers(1, 2**32, words, dtype=np.uint32) for _ in range(calls)]
        groups.append((inputs, red_port.call_group_async(name.encode(), [x.tobytes() for x in inputs], hint=1, timeouts_ms=60000)))
    every = [x for inputs, _ in groups for x in inputs]
    for inputs, futures in groups:
        for k, (x, fut) in enumerate(zip(inputs, futures)):
            got = np.frombuffer(fut.result(60), np.uint32)
            assert np.array_equal(got, expected(name, x, len(x))), (name, len(x), k)
            others = np.concatenate([y for y in every if y is not x])
            assert not np.isin(got[got > 0x10000], others).any()
    # a component of an output vector written by index, or the output read
    # (red team 8): one dispatch per call
    slot_form = name not in ("vec_component", "next_slot", "atomic_read_past", "read_past_output", "compound_past")
    assert stat(red_port, "slot_dispatches") - before == (len(sizes) if slot_form else 0)
    alone = inputs[-1]
    assert red_port.call("execute_kernel", name.encode(), alone.tobytes(), 1) == expected(name, alone, len(alone)).tobytes()


# -- 2. the budget right after the last reply of every failure road ---------


LOOPS = HEAD + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var s = gid.x;
    for (var k = 0u; k < src[0]; k++) { s = s * 1664525u + 1013904223u; }
    if (gid.x < arrayLength(&dst)) { dst[gid.x] = s; }
}
"""
BROKEN = HEAD + "@compute @workgroup_size(64) fn main() { dst[0] = nope; }\n"
DEBUG_HEAD = HEAD + """
struct KemDebug { count: atomic<u32>, records: array<u32> }
@group(0) @binding(15) var<storage, read_write> kem_debug: KemDebug;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&dst)) { return; }
    dst[i] = src[i] * 2u;
    let r = atomicAdd(&kem_debug.count, 1u);
    if (r < arrayLength(&kem_debug.records)) { kem_debug.records[r] = i; }
}
"""
NAMED = """
@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&y)) { y[gid.x] = x[gid.x] + 1u; }
}
"""


def _words(n: int, first: int = 0) -> bytes:
    return np.array([first] + [7] * (n - 1), np.uint32).tobytes()


def _roads(rng) -> list[tuple[str, tuple, dict, str | None]]:
    """(method, args, call_async options, the reason it must fail with; None: succeeds)."""
    opts = lambda **kw: {terms.atom(k): v for k, v in kw.items()}  # noqa: E731
    good = rng.integers(0, 2**31, 16, dtype=np.uint32).tobytes()
    return [
        ("execute_kernel", (b"no_such_kernel", good, 1), {}, "kernel_not_found"),
        ("execute_kernel", (b"broken", good, 1), {}, None),  # shader_error or bad_kernel, from admission
        ("execute_kernel", (b"double", good, 1 << 30), {}, None),  # an output past the limits
        ("execute", (b"loops", _words(64, 60000), opts(output_size=256, gas_limit=1000)), {}, "gas_exhausted"),
        ("execute", (b"debugged", good, opts(debug=True)), {}, "ok"),
        ("execute", (b"double", good, opts(debug=True)), {}, "ok"),  # no channel: no records
        ("run", (b"named", {b"x": good}, {"grid": (16, 1, 1)}), {}, None),  # a missing buffer
        ("run", (b"named", {b"x": good, b"y": good}, {"grid": (16, 1, 1), "constants": {"nope": 1}}), {}, None),
        ("run", (b"named", {b"x": good, b"y": good}, {"grid": (1 << 30, 1, 1)}), {}, None),  # a grid past the limits
    ]


@pytest.fixture(scope="module")
def budget_port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("red6_budget"), {"loops": LOOPS, "broken": BROKEN, "debugged": DEBUG_HEAD, "named": NAMED}) as client:
        yield client


def held(port) -> tuple[int, int]:
    stats = port.call_plain("stats")
    return stats["held_calls"], stats["held_bytes"]


def test_every_failure_road_gives_its_share_back_before_its_reply(budget_port, rng):
    """Each road in turn, five rounds: the stats request is sent only once
    the call's reply is in, with no sleep, and must read (0, 0): a share
    given back after the reply is written can be read as held."""
    for _ in range(5):
        for method, args, kw, reason in _roads(rng):
            fut = budget_port.call_async(method, *args, **kw)
            try:
                fut.result(60)
                got = "ok"
            except PortError as err:
                got = err.reason
                assert got != "internal", err
            if reason is not None:
                assert got == reason, (method, args[0], got)
            else:
                assert got != "ok", (method, args[0])
            assert held(budget_port) == (0, 0), (method, args[0], got)


def test_timeouts_and_group_members_give_their_shares_back(budget_port, rng):
    """Calls that expire while queued behind a held GPU thread (TimeoutMs 1),
    and a group frame where some members expire and the rest are answered:
    (0, 0) right after the last reply."""
    for _ in range(2):
        slow = budget_port.call_async("test_hook", terms.atom("sleep_gpu"), 300)  # the GPU thread held 300 ms
        late = [budget_port.call_async("execute_kernel", b"double", _words(16, 3), 1, timeout_ms=1) for _ in range(4)]
        inputs = [rng.integers(0, 2**31, 16, dtype=np.uint32) for _ in range(8)]
        group = budget_port.call_group_async(b"double", [x.tobytes() for x in inputs], hint=1,
                                             timeouts_ms=[1, 60000] * 4)
        reasons = []
        for fut in late + group + [slow]:
            try:
                fut.result(60)
                reasons.append("ok")
            except PortError as err:
                reasons.append(err.reason)
        assert held(budget_port) == (0, 0), reasons
        assert set(reasons) <= {"ok", "timeout"} and "timeout" in reasons[:12], reasons
        for x, fut, r in zip(inputs, group, reasons[4:12]):
            if r == "ok":
                assert fut.result() == (x * np.uint32(2)).tobytes()


# -- 3. one kernel id, two sources: two ports sharing a cache directory -------

PLUS = HEAD + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&dst)) { dst[gid.x] = src[gid.x] + PLUSu; }
}
"""
# Nested block comments hide a write from the lexer and from naga alike:
# both read the canonical text, where the whole comment is blank.
HIDDEN = PLUS.replace("+ PLUSu; }", "+ PLUSu; /* /* */ dst[0] = 0xbadu; */ }\n// */ dst[1] = 0xbadu;")


def test_one_kernel_id_with_two_sources_on_two_ports_sharing_a_cache(tmp_path, rng):
    """Ports A and B share KEM_CACHE_DIR; kernel 'k' is x + 1 on A and
    x + 2 on B (B's with nested comments): each answers its own source's
    values, alone and grouped, whichever admitted first."""
    cache = tmp_path / "cache"
    dirs = []
    for plus in (1, 2):
        d = tmp_path / f"node{plus}"
        d.mkdir()
        (d / "k.wgsl").write_text((HIDDEN if plus == 2 else PLUS).replace("PLUS", str(plus)))
        dirs.append(d)
    with start_port(KEM_KERNEL_DIR=str(dirs[0]), KEM_CACHE_DIR=str(cache)) as a, \
            start_port(KEM_KERNEL_DIR=str(dirs[1]), KEM_CACHE_DIR=str(cache)) as b:
        first = [(port.call_async("execute_kernel", b"k", x.tobytes(), 1), x, plus)  # both admitted at once
                 for port, plus, x in ((a, 1, rng.integers(0, 2**31, 7, dtype=np.uint32)), (b, 2, rng.integers(0, 2**31, 9, dtype=np.uint32)))]
        assert [f.result(60) for f, _, _ in first] == [(x + np.uint32(plus)).tobytes() for _, x, plus in first]
        for port, plus in ((a, 1), (b, 2), (b, 2), (a, 1)):
            x = rng.integers(0, 2**31, int(rng.choice([3, 64, 200])), dtype=np.uint32)
            assert port.call("execute_kernel", b"k", x.tobytes(), 1) == (x + np.uint32(plus)).tobytes()
            group = [rng.integers(0, 2**31, 40, dtype=np.uint32) for _ in range(6)]
            got = [f.result(60) for f in port.call_group_async(b"k", [y.tobytes() for y in group], hint=1, timeouts_ms=60000)]
            assert got == [(y + np.uint32(plus)).tobytes() for y in group]
