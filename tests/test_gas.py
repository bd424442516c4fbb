"""Gas (issue 27): every loop of a kernel counted and capped, on real wgpu.

Runaway kernels of every shape end by their budget and report that they
ran out; small kernels' gas matches counts worked out by hand; correct
kernels' outputs are unchanged against numpy on fresh random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from gas_helpers import run
from kem_port.errors import KemError
from kem_port.gpu import gas_meter
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.gpu.wgsl.wgsl_canonical import canonical

HEAD = """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
"""
SPIN_HEAD = """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<atomic<u32>>;
"""
ENTRY = "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) i: u32) {"
ZEROS = np.zeros(64, np.uint32)

RUNAWAYS = {
    "tight loop": HEAD + ENTRY + " loop { } }",
    "while true": HEAD + ENTRY + " var x = 0u; while true { x += inp[g.x]; } out[g.x] = x; }",
    "for without end": HEAD + ENTRY + " var x = 0u; for (;;) { x ^= 3u; } out[g.x] = x; }",
    "nested": HEAD + ENTRY + """ var x = 0u;
        for (var a = 0u; a < 100000u; a++) { for (var b = 0u; b < 100000u; b++) { x += a ^ b; } } out[g.x] = x; }""",
    "barrier loop": HEAD + "var<workgroup> s: array<u32, 64>;\n" + ENTRY + """
        var x = 0u; loop { s[i] = x; workgroupBarrier(); x += s[63u - i]; workgroupBarrier(); } }""",
    "barrier in a helper": HEAD + "var<workgroup> s: array<u32, 64>;\nfn sync(i: u32) { s[i] = i; workgroupBarrier(); }\n"
        + ENTRY + " for (var k = 0u; k < i; k++) { } while (inp[0] == 0u) { sync(i); } }",
    "loop in a helper": HEAD + "fn spin(x: u32) -> u32 { var y = x; loop { y = y * 3u + 1u; if (y == 0u && x == 5u) { break; } } return y; }\n"
        + ENTRY + " out[g.x] = spin(g.x); }",
    "atomic spin on a flag": SPIN_HEAD + ENTRY + " loop { if (atomicLoad(&out[1]) == inp[0] + 1u) { break; } } atomicStore(&out[2], 7u); }",
}


@pytest.mark.parametrize("name", sorted(RUNAWAYS))
def test_a_runaway_ends_by_its_budget_and_reports_it_ran_out(name):
    cap = 2000
    _, (gas, ran_out), form = run(RUNAWAYS[name], ZEROS, 64, 1, cap)
    assert form.metered and ran_out
    # each invocation passed its cap (one more tick breaks), never far past it
    assert 64 + 64 * (cap + 1) <= gas <= 64 + 64 * 2 * (cap + 2), gas


def test_a_barrier_loop_breaks_on_the_uniform_counter():
    form = wgsl_gas.gas_form(canonical(RUNAWAYS["barrier in a helper"]))
    assert (form.loops, form.uniform_loops) == (2, 1)
    assert "kem_gas_u > kem_gas_cap.x" in form.text


def body(loops: str, tail: str = "out[g.x] = acc;") -> str:
    return HEAD + ENTRY + " var acc = 0u; " + loops + " " + tail + " }"


# (kernel, workgroups, gas): invocations launched + loop iterations, by hand
HAND_COUNTED = {
    "64 x 10": (body("for (var k = 0u; k < 10u; k++) { acc += k; }"), 1, 64 + 64 * 10),
    "nested 3 x 4": (body("for (var a = 0u; a < 3u; a++) { var b = 0u; while (b < 4u) { b++; acc += b; } }"), 1, 64 + 64 * (3 + 12)),
    "per invocation": (body("for (var k = 0u; k < g.x; k++) { acc += 1u; }"), 2, 128 + sum(range(128))),
    "early return": (body("for (var k = 0u; k < 3u; k++) { acc += k; } if (g.x % 2u == 0u) { return; }"), 1, 64 + 64 * 3),
    "loop and break": (body("var k = 0u; loop { k++; if (k == 5u) { break; } }"), 1, 64 + 64 * 5),
    "helper twice": (HEAD + "fn f(n: u32) -> u32 { var s = 0u; for (var k = 0u; k < n; k++) { s += k; } return s; }\n"
                     + ENTRY + " out[g.x] = f(5u) + f(2u); }", 1, 64 + 64 * 7),
    "barrier reduction": (HEAD + "var<workgroup> t: array<u32, 64>;\n" + ENTRY + """
        t[i] = inp[g.x]; workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) { if (i < s) { t[i] += t[i + s]; } workgroupBarrier(); }
        if (i == 0u) { out[g.x / 64u] = t[0]; } }""", 3, 192 + 192 * 6),
}


@pytest.mark.parametrize("name", sorted(HAND_COUNTED))
def test_gas_is_invocations_plus_iterations(name):
    text, workgroups, expected = HAND_COUNTED[name]
    _, (gas, ran_out), _ = run(text, np.arange(64 * workgroups, dtype=np.uint32), 64 * workgroups, workgroups, 1000)
    assert (gas, ran_out) == (expected, False)


def test_the_cap_is_exact():
    text = HAND_COUNTED["64 x 10"][0]
    assert run(text, ZEROS, 64, 1, 10)[1] == (704, False)
    assert run(text, ZEROS, 64, 1, 9)[1] == (64 + 64 * 10, True)  # the 10th tick passes 9 and breaks


def test_the_meter_carries_into_its_high_word():
    text = HAND_COUNTED["64 x 10"][0]
    _, (gas, _), _ = run(text, ZEROS, 64, 1, 1000, meter_start=(0xFFFFFFFF - 100, 0))
    assert gas == 64 + 0xFFFFFFFF - 100 + 640


LOOPING = body("for (var k = 0u; k < inp[g.x] % 17u; k++) { acc = acc * 31u + k; }")
REDUCTION = HAND_COUNTED["barrier reduction"][0]


def _looping_expected(data: np.ndarray) -> np.ndarray:
    out = np.zeros_like(data)
    for index, value in enumerate(data.tolist()):
        acc = 0
        for k in range(value % 17):
            acc = (acc * 31 + k) & 0xFFFFFFFF
        out[index] = acc
    return out


@pytest.mark.parametrize("workgroups", [1, 3, 16])
def test_outputs_of_correct_kernels_are_unchanged(workgroups):
    rng = np.random.default_rng()
    data = rng.integers(0, 2**32, 64 * workgroups, dtype=np.uint32)
    got, (gas, ran_out), _ = run(LOOPING, data, data.size, workgroups, 100)
    np.testing.assert_array_equal(got, _looping_expected(data))
    assert (gas, ran_out) == (data.size + int(np.sum(data % 17)), False)
    small = rng.integers(0, 2**20, 64 * workgroups, dtype=np.uint32)
    got, (_, ran_out), _ = run(REDUCTION, small, workgroups, workgroups, 100)
    np.testing.assert_array_equal(got, small.reshape(workgroups, 64).sum(axis=1, dtype=np.uint32))
    assert not ran_out


def test_a_kernel_without_loops_is_left_alone():
    text = canonical(HEAD + ENTRY + " out[g.x] = inp[g.x] * 2u; }")
    assert wgsl_gas.gas_form(text) == wgsl_gas.GasForm(text, False)


def test_every_loop_keyword_gets_its_tick():
    text = canonical(RUNAWAYS["nested"] + "\nfn h() { loop { break; } while false { } for (;false;) { } }")
    form = wgsl_gas.gas_form(text)
    assert form.loops == 5 and form.text.count("if (kem_gas_n < 4294967295u) { kem_gas_n += 1u; }") == 5


@pytest.mark.parametrize("text, detail", [
    (body("var kem_gas_n = 0u; loop { }"), "kem_gas_n: names starting kem_gas_"),
    (HEAD + "@group(1) @binding(0) var<storage, read> x: array<u32>;\n" + ENTRY + " loop { } }", "@group(0) only"),
    (HEAD + "fn workgroupBarrier() { }\n" + ENTRY + " loop { workgroupBarrier(); } }", "workgroupBarrier: kem reserves"),
    (HEAD + "fn b() { workgroupBarrier(); }\n" + ENTRY + " let b = 1u; loop { if (b == 1u) { break; } } }", "b: kem reserves"),
])
def test_what_the_transform_cannot_account_for_is_refused(text, detail):
    with pytest.raises(KemError) as caught:
        wgsl_gas.gas_form(canonical(text))
    assert caught.value.reason == "bad_kernel" and detail in caught.value.detail
    assert caught.value.detail.split(":")[0].isdigit()  # line:col


@pytest.mark.parametrize("declared", [
    "const uniform = 1u;",  # broke kem's own var<uniform>: naga refused it quoting kem's code
    "fn atomicAdd(p: ptr<function, u32>, v: u32) -> u32 { return 0u; }",
    "fn atomicMax(p: ptr<function, u32>, v: u32) -> u32 { return 0u; }",
    "alias vec4 = vec2;", "struct atomic { a: u32 }",
])
def test_a_kernel_that_shadows_a_name_the_gas_code_uses_is_refused(declared):
    """WGSL lets a module-scope declaration shadow a predeclared function or
    type (naga follows): the tick and the flush must mean what kem wrote."""
    text = HEAD + declared + "\n" + ENTRY + " var x = 0u; for (var k = 0u; k < 5000u; k++) { x += 1u; } out[g.x] = x; }"
    with pytest.raises(KemError) as caught:
        wgsl_gas.gas_form(canonical(text))
    assert caught.value.reason == "bad_kernel" and "a name kem's gas code uses" in caught.value.detail


def test_a_kernel_of_its_own_min_is_still_bounded():
    """The tick calls no predeclared function: a kernel's own `fn min`
    returning 0 (which once kept the count at 1: 5000 turns ran past a cap of
    100) is admitted now and still runs out at its cap."""
    text = HEAD + "fn min(a: u32, b: u32) -> u32 { return 0u; }\n" + ENTRY + " var x = 0u; for (var k = 0u; k < 5000u; k++) { x += min(k, 1u); } out[g.x] = x; }"
    _, (gas, ran_out), _ = run(text, ZEROS, 64, 1, 100)
    assert ran_out and gas == 64 + 64 * 101


@pytest.mark.parametrize("local", ["let min = 3u;", "var min = 3u;"])
def test_a_local_named_like_a_builtin_compiles_and_counts(local):
    """Ticks sit inside the kernel's own functions, where a local `min` hides
    the builtin: naga refused the old tick (`min(...)`, "local declaration
    cannot be called", red team of wave 3)."""
    text = HEAD + ENTRY + f" {local} var x = 0u; for (var k = 0u; k < min; k++) {{ x += 2u; }} out[g.x] = x; }}"
    _, (gas, ran_out), _ = run(text, ZEROS, 64, 1, 100)
    assert (gas, ran_out) == (64 + 64 * 3, False)


def test_a_member_named_like_a_builtin_is_no_shadow():
    text = HEAD + "struct Box { min: u32, max: u32 }\n" + ENTRY + " var b = Box(1u, 3u); for (var k = b.min; k < b.max; k++) { } out[g.x] = b.min; }"
    _, (gas, ran_out), _ = run(text, ZEROS, 64, 1, 100)
    assert (gas, ran_out) == (64 + 64 * 2, False)


def test_per_invocation_cap_shares_what_launching_leaves():
    assert gas_meter.per_invocation_cap(704, 64, 60_000) == 10
    assert gas_meter.per_invocation_cap(10**18, 64, 60_000) == 60_000
    with pytest.raises(KemError) as caught:
        gas_meter.per_invocation_cap(63, 64, 60_000)
    assert caught.value.reason == "gas_exhausted"
