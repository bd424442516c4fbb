"""Red team of issue 24: attacks on the new defences, through the real
parts (the WGSL lexer and rewrites kem runs, the real port, lavapipe).

Findings (each test failed on the code before its fix):
* a run of zeros made every token function of wgsl_canonical quadratic
  (20 KB: 2.3 s, a 1 MiB kernel: hours, before any compile);
* the workgroup clearing's "does this type hold an atomic" walk was
  exponential in a chain of structs that name the one before twice
  (a 1.3 KB kernel: hours, holding the admission lock), and a chain of
  1,000 aliases raised RecursionError.
Held (regression tests): see the tests below the findings.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import start_port
from kem_port.admission.zeroing import zero_workgroup_memory
from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import canonical, identifier_counts, sequence_count, tokens

# -- the lexer's speed ---------------------------------------------------------

# The spec's number literals (WGSL 3.4), one pattern each: the spec lexes
# the longest match of any of them, which is what this reference does.
_SPEC_NUMBERS = [re.compile(p) for p in (
    r"0[xX][0-9a-fA-F]*\.[0-9a-fA-F]+(?:[pP][+-]?[0-9]+[fh]?)?",
    r"0[xX][0-9a-fA-F]+\.[0-9a-fA-F]*(?:[pP][+-]?[0-9]+[fh]?)?",
    r"0[xX][0-9a-fA-F]+[pP][+-]?[0-9]+[fh]?",
    r"0[xX][0-9a-fA-F]+[iu]?",
    r"[0-9]*\.[0-9]+(?:[eE][+-]?[0-9]+)?[fh]?",
    r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?[fh]?",
    r"[0-9]+[eE][+-]?[0-9]+[fh]?",
    r"(?:0|[1-9][0-9]*)[fh]",
    r"(?:0|[1-9][0-9]*)[iu]?",
)]
_SPEC_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def spec_words(text: str) -> list[str]:
    """Identifiers and numbers of text by the spec's longest-match rule,
    one position at a time (slow, obviously right)."""
    out, at = [], 0
    while at < len(text):
        found = [m.group() for p in (*_SPEC_NUMBERS, _SPEC_IDENT) if (m := p.match(text, at))]
        best = max(found, key=len, default="")
        if best:
            out.append(best)
            at += len(best)
        else:
            at += 1
    return out


@given(st.text(alphabet="0123456789.eExXfhiupa+- ", max_size=24))
@settings(max_examples=500, deadline=None)
def test_numbers_and_names_split_where_the_spec_splits_them(text):
    """The digit-run shortcut changes no token boundary."""
    words = [value for kind, value, _ in tokens(text) if kind != "punct"]
    assert words == spec_words(text)
    assert identifier_counts(text) == Counter(w for w in words if not (w[0].isdigit() or w[0] == "."))


@pytest.mark.parametrize("run", ["0" * (1 << 20), "00000000 " * (1 << 17), "0" * (1 << 19) + "e", "0" * (1 << 19) + "x1"])
def test_a_megabyte_of_zeros_is_lexed_in_linear_time(run):
    """BEFORE: 20 KB of zeros took 2.3 s in each token function (each
    "0" rescanned the run for a "."), so 1 MiB took hours."""
    for analysis in (lambda t: list(tokens(t)), identifier_counts, lambda t: sequence_count(t, ("var", "<", "workgroup"))):
        started = time.perf_counter()
        analysis(run)
        # 10 s, not 1: CI's machine took 1.05 s once; quadratic took hours.
        assert time.perf_counter() - started < 10.0


# -- workgroup clearing's type walk -------------------------------------------


def struct_ladder(levels: int) -> str:
    """S_k holds S_{k-1} twice, once by an alias: 2^levels paths to S0."""
    lines = ["struct S0 { x: u32 }"]
    for k in range(1, levels + 1):
        lines += [f"alias B{k - 1} = S{k - 1};", f"struct S{k} {{ a: S{k - 1}, b: B{k - 1} }}"]
    return "\n".join(lines + [f"var<workgroup> w: S{levels};", "@compute @workgroup_size(1)\nfn main() { _ = w.a; }\n"])


def alias_chain(length: int, atomic: bool) -> str:
    lines = ["alias A0 = " + ("atomic<u32>;" if atomic else "u32;")]
    lines += [f"alias A{k} = A{k - 1};" for k in range(1, length + 1)]
    return "\n".join(lines + [f"var<workgroup> w: array<A{length}, 4>;", "@compute @workgroup_size(1)\nfn main() { _ = w[0]; }\n"])


def test_a_ladder_of_structs_is_cleared_in_linear_time():
    """BEFORE: 14 levels took 1.1 s, each level twice the last (40 levels,
    a 2 KB kernel: years), under the admission lock."""
    started = time.perf_counter()
    cleared = zero_workgroup_memory(struct_ladder(40))
    assert time.perf_counter() - started < 10.0  # exponential: years
    assert "if (_kem_lii == 0u) { w = S40(); }" in cleared


@pytest.mark.parametrize("atomic", [False, True])
def test_a_long_alias_chain_is_an_answer_not_a_recursion_error(atomic):
    """BEFORE: RecursionError (an `internal` reply) past ~1,000 aliases."""
    started = time.perf_counter()
    if atomic:  # cleared element by element since the compatibility sweep (once refused)
        assert "atomicStore(&w[_kem_i], 0);" in zero_workgroup_memory(alias_chain(5000, atomic=True))
    else:
        assert "_kem_i < u32(4)" in zero_workgroup_memory(alias_chain(5000, atomic=False))
    assert time.perf_counter() - started < 10.0


# -- dispatch isolation: a plain kernel that reads everything it can ----------

# Word 0: arrayLength of its input; word 1 + k: input[k] for every k the
# output can hold (far past its own input: robust access must keep it in
# its own binding); a params variant adds its uniform's 16 words.
PLAIN_DUMP = """
@group(0) @binding(0) var<storage, read> input: array<u32>;
@group(0) @binding(1) var<storage, read_write> output: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let k = gid.x + gid.y * n.x * 64u;
    if (k >= arrayLength(&output)) { return; }
    if (k == 0u) { output[0] = arrayLength(&input); return; }
    output[k] = input[k - 1u] | input[k + 4096u] | input[0xffffffffu - k];
}
"""
DUMP_OUT = 16 * 1024


@pytest.fixture(scope="module")
def dump_port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("kernels")
    (kernels / "dump.wgsl").write_text(PLAIN_DUMP)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache")) as client:
        for kernel in (b"dump", b"double"):
            client.call("execute_kernel", kernel, bytes(8), 1)
        yield client


def _frame(req_id: int, kernel: bytes, data: bytes, hint: int) -> bytes:
    from kem_port.wire import terms
    return terms.encode((terms.atom("call"), req_id, terms.atom("execute_kernel"), (terms.Binary(kernel), terms.Binary(data), hint)))


@pytest.mark.parametrize("round_", range(2))
def test_a_plain_kernel_reading_far_out_of_range_sees_only_its_own_input(dump_port, rng, round_):
    """Held: singles [dump, double(victim), dump, ...] and a group of dumps
    (the slot form) behind a sleeping GPU, odd sizes: every word a dump
    reads is its own input's or 0 (lavapipe clamps into the binding)."""
    from kem_port.wire import group_frames, terms
    busy = dump_port.call_async("test_hook", terms.atom("sleep_gpu"), 300)
    time.sleep(0.1)
    size_a = 4 * int(rng.integers(1, 9))
    victims = [rng.integers(1 << 31, 1 << 32, int(rng.integers(1, 50)), dtype=np.uint64).astype("<u4").tobytes() for _ in range(4)]
    dumps = [rng.integers(1, 1 << 31, size_a // 4, dtype=np.uint64).astype("<u4").tobytes() for _ in range(3 + 8)]
    hint = DUMP_OUT // size_a
    ids = dump_port.next_req_ids(7)
    singles = [(b"dump", dumps[0]), (b"double", victims[0]), (b"dump", dumps[1]), (b"double", victims[1]),
               (b"dump", dumps[2]), (b"double", victims[2]), (b"double", victims[3])]
    frames = [_frame(r, k, d, hint if k == b"dump" else 1) for r, (k, d) in zip(ids, singles)]
    group_ids = dump_port.next_req_ids(8)
    frames.append(group_frames.encode_group(b"dump", hint, [(r, 60000) for r in group_ids], dumps[3:]))
    order = list(zip(ids, singles)) + [(r, (b"dump", d)) for r, d in zip(group_ids, dumps[3:])]
    futures = dump_port.call_raw_batch(frames, [r for r, _ in order])
    secret = {int(w) for v in victims for w in np.frombuffer(v, "<u4")}
    for fut, (_, (kernel, data)) in zip(futures, order):
        reply = fut.result(60)
        x = np.frombuffer(data, "<u4")
        if kernel == b"double":
            assert reply == (x * np.uint32(2)).tobytes()
            continue
        words = np.frombuffer(reply, "<u4")
        assert len(reply) == hint * size_a and int(words[0]) == len(x)
        assert not secret & {int(w) for w in words}
        own = {int(a) | int(b) | int(c) for a in list(x) + [0] for b in list(x) + [0] for c in list(x) + [0]}
        assert {int(w) for w in words[1:]} <= own
    busy.result(30)


# -- what an output holds that the kernel never wrote --------------------------

NOOP = """
@group(0) @binding(0) var<storage, read> input: array<u32>;
@group(0) @binding(1) var<storage, read_write> output: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x == 0xffffffffu) { output[0] = input[0]; }
}
"""


@pytest.fixture(scope="module")
def noop_port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("kernels")
    (kernels / "noop.wgsl").write_text(NOOP)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache")) as client:
        client.call("execute_kernel", b"noop", bytes(4), 1)
        yield client


def test_an_output_the_kernel_never_writes_is_zeros_not_a_previous_callers(noop_port, rng):
    """Held: pooled output buffers are cleared; singles, odd sizes and
    slot-form groups of a kernel that writes nothing, right after and
    beside victims' doubles, read back only zeros."""
    from kem_port.wire import terms
    for round_ in range(6):
        size = 4 * int(rng.integers(1, 2000))
        secret = rng.integers(1 << 31, 1 << 32, size // 4, dtype=np.uint64).astype("<u4").tobytes()
        busy = noop_port.call_async("test_hook", terms.atom("sleep_gpu"), 100) if round_ % 2 else None
        victims = [noop_port.call_async("execute_kernel", b"double", secret, 1) for _ in range(3)]
        noops = [noop_port.call_async("execute_kernel", b"noop", bytes(int(rng.integers(1, 64))), int(rng.integers(1, 300))) for _ in range(3)]
        noops += noop_port.call_group_async(b"noop", [bytes(size)] * 8)
        for fut in victims:
            assert fut.result(60) == (np.frombuffer(secret, "<u4") * np.uint32(2)).tobytes()
        for fut in noops:
            reply = fut.result(60)
            assert reply == bytes(len(reply)) and len(reply) > 0
        if busy is not None:
            busy.result(30)


# -- lavapipe compiles at the first dispatch, not at create_compute_pipeline ---

# Loop-free, 300 bytes: one dynamically indexed private array. On lavapipe
# naga and create_compute_pipeline take ~1 s (the compile worker's check),
# but llvmpipe JITs the shader at its first dispatch: 1,024 elements cost
# ~25 s there, 4,096 more than 150 s, on the port's GPU thread, with every
# other caller queued behind it.
JIT_BOMB = """
@group(0) @binding(0) var<storage, read> input: array<u32>;
@group(0) @binding(1) var<storage, read_write> output: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var a: array<u32, 4096>;
    if (gid.x < arrayLength(&output)) { output[gid.x] = a[input[0] & 4095u]; }
}
"""


def test_a_kernel_whose_first_dispatch_compiles_for_minutes_is_refused_in_the_worker(kernel_dir, rng):
    """BEFORE: the compile worker passed it in ~1 s and the port's GPU
    thread spent minutes in its first dispatch; a bystander's double, sent
    after it, waited as long (no answer in 40 s)."""
    # A fresh constant each run: Mesa's on-disk shader cache keeps any JIT
    # that ever finished, and would answer for it.
    salt = int(rng.integers(1, 2**31))
    (kernel_dir / "jit_bomb.wgsl").write_text(JIT_BOMB.replace("4095u];", f"4095u] + {salt}u;"))
    port = start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache"))
    try:
        if json.loads(port.call_plain("adapter_info"))["adapter_type"] != "CPU":
            pytest.skip("a GPU driver compiles at pipeline creation: the bomb is a CPU adapter's (llvmpipe JITs at first dispatch)")
        port.call("execute_kernel", b"double", bytes(8), 1)
        bomb = port.call_async("execute_kernel", b"jit_bomb", bytes(16), 16)
        time.sleep(1.0)
        words = rng.integers(0, 2**31, 64, dtype=np.uint32)
        bystander = port.call_async("execute_kernel", b"double", words.tobytes(), 1)
        assert bystander.result(40) == (words * np.uint32(2)).tobytes()
        with pytest.raises(Exception) as refused:
            bomb.result(130)  # 20 s of the worker's CPU time (wall time grows with load); 60 s wall backstop, twice
        assert getattr(refused.value, "reason", None) == "kernel_rejected", refused.value
    finally:
        port.proc.kill()
        port.proc.wait(10)


# -- workgroup memory between the slots of one dispatch ------------------------

# Mode 0 (a victim) puts its secret in workgroup memory; mode 1 (an
# attacker, the same published kernel) reads it without writing. In the
# slot form both are workgroups of ONE dispatch: with KEM_ZERO_WORKGROUP=off
# on lavapipe the attackers read 10,240 of 10,240 secret words.
WG_MODES = """
@group(0) @binding(0) var<storage, read> input: array<u32>;
@group(0) @binding(1) var<storage, read_write> output: array<u32>;
var<workgroup> shared_words: array<u32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lii: u32, @builtin(global_invocation_id) gid: vec3<u32>) {
    if (input[0] == 0u) {
        shared_words[lii] = input[1u + lii];
        workgroupBarrier();
        output[gid.x] = input[1u + lii] * 2u;
    } else {
        workgroupBarrier();
        output[gid.x] = shared_words[lii];
    }
}
"""


def test_co_grouped_callers_never_see_each_others_workgroup_memory(kernel_dir, rng):
    """Held (zeroing on, the default): one slot dispatch a group, victims
    and attackers interleaved; attackers read zeros, victims numpy's."""
    from kem_port.wire import terms
    (kernel_dir / "wg_modes.wgsl").write_text(WG_MODES)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        port.call("execute_kernel", b"wg_modes", bytes(65 * 4), 1)
        before = {terms.atom_name(k): v for k, v in port.call("stats").items()}.get("slot_dispatches", 0)
        for _ in range(4):
            secrets = [rng.integers(1 << 31, 1 << 32, 64, dtype=np.uint64).astype("<u4") for _ in range(16)]
            inputs = []
            for secret in secrets:
                inputs += [np.concatenate([[0], secret]).astype("<u4").tobytes(), np.array([1] + [0] * 64, "<u4").tobytes()]
            replies = [f.result(60) for f in port.call_group_async(b"wg_modes", inputs)]
            for k, secret in enumerate(secrets):
                # 65 words out: two workgroups, the second's first invocation writes word 64.
                assert replies[2 * k] == (np.append(secret, secret[0]) * np.uint32(2)).tobytes()
                assert replies[2 * k + 1] == bytes(260)
        assert {terms.atom_name(k): v for k, v in port.call("stats").items()}["slot_dispatches"] == before + 4


# -- a single call's explicit workgroups ---------------------------------------


def test_a_calls_explicit_workgroups_are_bounded_as_a_chain_steps_are(rng):
    """BEFORE: `execute` (kem:execute's workgroups option, any requester's
    field per docs/security.md) of kem's own double with 16 input bytes and
    workgroups {65535, 65535, 64} -- 2.7e11 invocations -- held the port's
    GPU thread past 30 s, until the caller's timeout restarted the port and
    blamed double; only each dimension was checked (<= 65,535)."""
    port = start_port()
    try:
        for groups in ((65535, 65535, 64), (65535, 65535, 1), (65535, 1024, 1)):
            started = time.perf_counter()
            with pytest.raises(Exception) as err:
                port.call("execute", b"double", bytes(16), {"workgroups": groups}, timeout=10)
            assert getattr(err.value, "reason", None) == "bad_args" and "workgroups" in err.value.detail, err.value
            assert time.perf_counter() - started < 10.0  # refused, not run (it ran past 30 s); 2.5 s on an H200
        for n in (64, 1000, 4096):
            words = rng.integers(0, 2**31, n, dtype=np.uint32)
            want = (words * np.uint32(2)).tobytes()
            assert port.call("execute", b"double", words.tobytes(), {"workgroups": (-(-n // 64), 1, 1)}) == want
            assert port.call("execute", b"double", words.tobytes(), {"workgroups": (65535, 1, 1)}) == want  # within the bound
    finally:
        port.proc.kill()
        port.proc.wait(10)


# -- shadowing the predeclared names kem's own code calls ----------------------

# WGSL lets a module-scope declaration shadow a predeclared function or
# type alias, and naga follows: kem's appended code then calls the
# kernel's. The slot form's kem_out clamps with select(); a kernel whose
# own select returns its second argument unclamped indexes every slot of
# the group's output (u32 wrap reaches the slots before it). Mode 0 is a
# victim (doubles its input), mode 1 an attacker on the same published
# kernel reading 4,095 words either side.
SHADOW_SELECT = """
@group(0) @binding(0) var<storage, read> input: array<u32>;
@group(0) @binding(1) var<storage, read_write> output: array<u32>;
fn select(f: u32, t: u32, c: bool) -> u32 { return t; }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&output);
    if (gid.x >= n) { return; }
    if (input[0] == 0u) {
        output[gid.x] = input[gid.x] * 2u;
    } else {
        var x = 0u;
        for (var k = 1u; k < 4096u; k++) { x = max(x, max(output[gid.x + k], output[gid.x - k])); }
        output[gid.x] = x;
    }
}
"""


def test_a_kernel_shadowing_select_never_reads_another_slot(kernel_dir, rng):
    """BEFORE: 20 of 20 attacker replies held a victim's output word (the
    slot form ran: 5 slot dispatches, no canary broken: reads leave none)."""
    (kernel_dir / "shadow.wgsl").write_text(SHADOW_SELECT)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        port.call("execute_kernel", b"shadow", bytes(64), 1)
        seen = 0
        for _ in range(5):
            inputs, doubled = [], set()
            for k in range(16):
                if k % 4 == 3:
                    inputs.append(np.array([1] + [0] * 15, "<u4").tobytes())
                else:
                    secret = np.concatenate([[0], rng.integers(1 << 30, 1 << 31, 15, dtype=np.uint64)]).astype("<u4")
                    doubled |= {int(w) for w in secret[1:] * np.uint32(2)}
                    inputs.append(secret.tobytes())
            replies = [f.result(60) for f in port.call_group_async(b"shadow", inputs)]
            for k, reply in enumerate(replies):
                words = np.frombuffer(reply, "<u4")
                if k % 4 == 3:
                    seen += len(doubled & {int(w) for w in words})
                else:
                    assert words.tolist() == (np.frombuffer(inputs[k], "<u4") * np.uint32(2)).tolist()
        assert seen == 0, f"attackers read {seen} victim output words"


# The clearing prologue ends with workgroupBarrier() and clears atomics with
# atomicStore(): a kernel's own no-op versions left the memory uncleared
# for the other invocations (lavapipe: the writer's secret read back, 256
# words in one of two runs).
SHADOW_BARRIER = """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
var<workgroup> secret: array<u32, 256>;
var<workgroup> tally: atomic<u32>;
fn {name}({params}) {{}}
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) w: vec3<u32>) {{
    out[w.x * 256u + i] = secret[255u - i] | atomicLoad(&tally) | (inp[0] & 0u);
}}
"""


@pytest.mark.parametrize("name, params", [("workgroupBarrier", ""), ("atomicStore", "p: ptr<workgroup, atomic<u32>>, v: u32")])
def test_a_kernel_shadowing_what_the_clearing_calls_is_refused(name, params):
    """BEFORE: cleared with the kernel's own no-op, and admitted."""
    with pytest.raises(KemError) as err:
        zero_workgroup_memory(SHADOW_BARRIER.format(name=name, params=params))
    assert err.value.reason == "kernel_rejected" and name in err.value.detail
