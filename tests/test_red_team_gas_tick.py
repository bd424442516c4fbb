"""Red team of the gas tick (061ab6b), the turns ceiling (8e7e67f) and
refusal text (f36a024), on real wgpu (lavapipe) and the real port."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import start_port
from kem_port.client import PortError
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.kernel_store import source_from_bytes
from kem_port.stats import Stats

# spins until a word no one writes changes: only its budget ends it
RUNAWAY = b"""
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = 0u;
  while (inp[0] != 12345u) { x += 1u; }
  out[g.x] = x;
}
"""


def _run_one(executor: Executor, call: KernelCall):
    got: list = []
    executor.run([Job(call, source_from_bytes(call.kernel_id, RUNAWAY, "test", "local"),
                      reply=lambda v: got.append(bytes(v)), fail=got.append)])
    assert len(got) == 1
    return got[0]


def test_each_device_keeps_its_own_turns_ceiling():
    """Two devices in one process (pytest's, or any embedder's): the
    ceiling was a module global, so the device opened last set it for
    both; a device opened with KEM_GAS_TURNS 1,000 let a runaway count
    60,000 turns an invocation once a default device opened after it."""
    strict = Executor(Config(gas_turns=1000), Stats())
    strict.open()
    Executor(Config(), Stats()).open()
    got = _run_one(strict, KernelCall("runaway", bytes(256), 256, gas_limit=1 << 40))
    assert isinstance(got, KemError) and got.reason == "gas_exhausted"
    assert got.detail.startswith(f"gas used {64 + 64 * 1001} "), got.detail  # 1,000 turns and the tick that broke


@pytest.mark.parametrize("key", [10**5000, 10**300, -(2**64)], ids=["5001 digits", "301 digits", "-2^64"])
def test_a_huge_integer_key_is_refused_short_by_the_decoder(key):
    """shown() would raise ValueError on an int past 4,300 digits (Python's
    str limit) and print 300 digits whole; the port's decoder refuses an
    integer over 8 bytes first, so no refusal text ever carries one."""
    with start_port() as port:
        with pytest.raises(PortError) as caught:
            port.call("execute", b"double", b"abcd", {key: 1})
        assert caught.value.reason == "too_large" and len(caught.value.detail) < 100
        assert port.call("execute", b"double", bytes([1, 0, 0, 0]), {}) == bytes([2, 0, 0, 0])


HEAD = """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
"""
ENTRY = "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {"
# diagnostic rule names are any name tokens, keywords included: naga takes
# these (a warning: unknown rule), so each is a valid kernel.
DIAGNOSTIC_LOOPS = {
    "attribute a.loop, no loop": ("", "@diagnostic(off, a.loop) fn h(v: u32) -> u32 { return v + 1u; }\n",
                                  "out[g.x] = h(inp[g.x]);", 0, 64),
    "attribute loop.for, a loop": ("", "@diagnostic(off, loop.for) fn h(v: u32) -> u32 { return v + 1u; }\n",
                                   "var acc = 0u; for (var k = 0u; k < 3u; k++) { acc += h(inp[g.x]); } out[g.x] = acc;", 1, 64 * 4),
    "directive a.while, a loop": ("diagnostic(off, a.while);\n", "struct S { v: u32 }\n",
                                  "var acc = S(0u); var k = 0u; while (k < 5u) { k++; acc.v += inp[g.x] + 1u; } out[g.x] = acc.v;", 1, 64 * 6),
}


@pytest.mark.parametrize("name", sorted(DIAGNOSTIC_LOOPS))
def test_a_loop_word_in_a_diagnostic_rule_is_not_a_loop(name, rng):
    """`@diagnostic(off, a.loop)` took `loop` for a loop statement: its tick
    went into the next '{' (a function's or a struct's body) and naga refused
    a valid kernel quoting kem's tick. A loop statement is never inside
    parentheses: only the loops there are ticked, and counted right."""
    from gas_helpers import run

    directive, decls, code, loops, gas = DIAGNOSTIC_LOOPS[name]
    data = rng.integers(0, 1000, 64, dtype=np.uint32)
    out, (used, ran_out), form = run(directive + HEAD + decls + ENTRY + " " + code + " }", data, 64, 1, 100)
    assert (form.loops, form.metered) == (loops, loops > 0)
    want = {0: data + 1, 1: (data + 1) * (3 if "for" in name else 5)}[loops]
    assert np.array_equal(out, want.astype(np.uint32)), out[:4]
    assert (used, ran_out) == (gas, False)  # loop-free: the 64 invocations launched


# sync reaches a barrier; its diagnostic attribute names a rule `fn.a`
BARRIER_HELPER = HEAD + """var<workgroup> s: array<u32, 64>;
@diagnostic(off, fn.a) fn sync(i: u32, v: u32) -> u32 { s[i] = v; workgroupBarrier(); let r = s[63u - i]; workgroupBarrier(); return r; }
@compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) {
  var acc = 0u;
  for (var k = 0u; k < i; k++) { acc += 1u; }
  for (var t = 0u; t < 4u; t++) { acc = sync(i, acc + t); }
  out[i] = acc;
}
"""


def test_a_fn_word_in_a_diagnostic_rule_does_not_hide_a_barrier_function():
    """`@diagnostic(off, fn.a) fn sync` was read as a function named '.', so
    a loop calling sync() was not a barrier loop: it broke on kem_gas_n,
    which the loop before it (i turns) makes differ between invocations, a
    break out of a barrier loop in non-uniform control flow (at cap 62,
    invocations 61-63 left while the rest waited at workgroupBarrier: on a
    GPU that is undefined, a hang at worst). Now it breaks on kem_gas_u."""
    from gas_helpers import run
    from kem_port.gpu.wgsl import wgsl_gas
    from kem_port.gpu.wgsl.wgsl_canonical import canonical

    form = wgsl_gas.gas_form(canonical(BARRIER_HELPER))
    assert (form.loops, form.uniform_loops) == (2, 1)
    acc = np.arange(64, dtype=np.uint64)
    for t in range(4):
        acc = (acc + t)[::-1]
    out, (gas, ran_out), _ = run(BARRIER_HELPER, np.zeros(64, np.uint32), 64, 1, 1000)
    assert np.array_equal(out, acc.astype(np.uint32)) and not ran_out
    assert gas == 64 + sum(range(64)) + 64 * 4


@pytest.mark.parametrize("frame, named", [
    (b"\x83t\x00\x00\x00\x01k\x00\x06outptua\x01", "'outptu'"),  # #{"outptu" => 1}: an Erlang string key
    (b"\x83t\x00\x00\x00\x01k\x00\x03a\x1b\x07a\x01", "'a\\x1b\\x07'"),
    (b"\x83t\x00\x00\x00\x01t\x00\x00\x00\x00a\x01", "a map"),  # #{#{} => 1}
])
def test_a_key_is_named_in_erlangs_words_not_pythons_type_names(frame, named):
    """erlang-py decodes an Erlang string key to bytes and a map key to a
    frozendict: shown() named them 'a bytes' and 'a frozendict', Python's
    words, to an Erlang caller who wrote #{"outptu" => 1}."""
    import erlang

    from kem_port.wire import protocol

    with pytest.raises(KemError) as caught:
        protocol.options(erlang.binary_to_term(frame), ("output_size",), "Opts", "option")
    assert caught.value.detail == f"unknown option {named}; known: output_size"


def test_a_huge_key_is_named_in_time_bounded_by_what_is_shown():
    """shown() escaped a key's whole text and then cut it to 40 characters:
    a 64 MiB binary key held the port's reader 23 s on this machine (8 MiB:
    1.6 s) for a refusal of 45 characters. Only what is shown is escaped."""
    import time

    import erlang

    from kem_port.wire import protocol

    key = erlang.OtpErlangBinary(b"\x01" * (32 << 20), 8)
    started = time.perf_counter()
    with pytest.raises(KemError) as caught:
        protocol.options({key: 1}, ("output_size",), "Opts", "option")
    elapsed = time.perf_counter() - started
    assert caught.value.detail == "unknown option '" + "\\x01" * 10 + "...'; known: output_size"
    assert elapsed < 0.5, elapsed  # was about 6 s (32 MiB); now microseconds


# Every name the tick and the flush touch, or could be thought to, declared
# by the kernel where WGSL lets it: params, locals, struct members, module
# consts and functions. Held: the tick names only kem_gas_* (refused in a
# kernel) and the flush is a module function whose locals shadow the kernel's.
SHADOWING = HEAD + """
struct S { x: u32, cap: u32, n: u32, old: u32, meter: u32 }
const n = 7u;
const old = 9u;
fn select(a: u32) -> u32 { return 0u; }
fn max(a: u32, b: u32) -> u32 { return 0u; }
fn h(storage: u32, uniform: u32, x: u32) -> u32 { return storage + uniform + x; }
""" + ENTRY + """ var s = S(1u, 2u, 3u, 4u, 5u);
  let cap = 1u; var x = 0u;
  for (var k = 0u; k < inp[g.x]; k++) { x += h(s.x, cap, n - old + 2u); }
  out[g.x] = x;
}
"""


@pytest.mark.parametrize("cap, ran_out", [(5000, False), (50, True)])
def test_shadowing_any_name_the_gas_code_reads_changes_no_count(cap, ran_out, rng):
    """Held (red team of 061ab6b): the loop runs inp[g.x] turns; under a cap
    above every count the meter holds exactly their sum and the outputs are
    right; under a cap of 50 the kernel ran out and no invocation passed 51."""
    from gas_helpers import run

    data = rng.integers(0, 200, 64, dtype=np.uint32)
    out, (gas, out_of_gas), form = run(SHADOWING, data, 64, 1, cap)
    assert form.metered and out_of_gas == ran_out
    if not ran_out:
        assert np.array_equal(out, data * 2) and gas == 64 + int(data.sum())
    else:
        assert gas == 64 + int(np.minimum(data, 51).sum())
        assert np.array_equal(out, np.minimum(data, 50) * 2)


def test_unbalanced_parentheses_hide_no_loop():
    """Loops inside parentheses are not ticked (a diagnostic rule's name):
    a ')' too many would put every later loop 'inside' one, so a text whose
    parentheses do not balance (naga takes none) is refused by the form."""
    from kem_port.gpu.wgsl import wgsl_gas

    with pytest.raises(KemError) as caught:
        wgsl_gas.gas_form("fn f() ) { loop { } }")
    assert caught.value.reason == "bad_kernel" and "parentheses" in caught.value.detail
