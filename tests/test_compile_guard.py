"""Hostile kernels (issue 13, items 1 and 4): kernels that crashed or
bloated the port's shader compiler are refused -- by structural limits or by
the sacrificial compile worker -- with a clear reason, remembered by hash on
disk, and the port keeps serving bystanders correct results meanwhile."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import start_port
from kem_port.wire import terms
from kem_port.client import PortError
from kem_port.admission.guard import CompileGuard, GuardSettings
from kem_port.errors import KemError
from kem_port.kernel_store import source_from_bytes
from kem_port.gpu.calls import KernelCall
from kem_port.admission.rejects import RejectStore
from kem_port.admission.limits import check_structure

HEAD = """@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
"""


def kernel(body: str, before: str = "") -> str:
    return (HEAD + before + "@compute @workgroup_size(64)\nfn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
            + "    if (g.x >= arrayLength(&out)) { return; }\n" + body + "\n}\n")


CALL_CHAIN = "".join(f"fn f{i}(x: u32) -> u32 {{ return f{i + 1}(x) + f{i + 1}(x ^ 1u); }}\n" for i in range(40))
ATTACKS = {
    "parens": kernel("out[g.x] = " + "(" * 3000 + "inp[g.x]" + ")" * 3000 + ";"),
    "calls": kernel("out[g.x] = " + "max(" * 3000 + "inp[g.x]" + ", 1u)" * 3000 + ";"),
    "flat_sum": kernel("out[g.x] = " + " + ".join(["inp[g.x]"] * 15000) + ";"),
    "else_if": kernel("var x = 0u;\nif (inp[0] == 0u) { x = 1u; }"
                      + "".join(f" else if (inp[0] == {i}u) {{ x = {i}u; }}" for i in range(1, 10000)) + "\nout[g.x] = x;"),
    "private_array": kernel("p[g.x % 7u] = inp[g.x]; out[g.x] = p[inp[0] % 1000u];", "var<private> p: array<u32, 50000000>;\n"),
    # The size behind a constant: only the worker's memory limit sees it.
    "private_array_const": kernel("p[g.x % 7u] = inp[g.x]; out[g.x] = p[inp[0] % 1000u];",
                                  "const N = 50000000u;\nvar<private> p: array<u32, N>;\n"),
    # 2^40 inlined calls: refused by the inlined-size bound (admission/limits.py) before any compile.
    "doubling_calls": kernel("out[g.x] = f0(inp[g.x]);", CALL_CHAIN + "fn f40(x: u32) -> u32 { return x * 3u; }\n"),
}
TRIPLE = kernel("out[g.x] = inp[g.x] * 3u;")
GUARD_ENV = {"KEM_COMPILE_TIMEOUT_MS": "4000", "KEM_COMPILE_MEMORY_MB": "512"}


MAIN = KernelCall("k", b"", 4)  # a call of entry point main, no params


def source(name: str, text: str):
    return source_from_bytes(name, text.encode(), "kernels/" + name, "strict")


@pytest.mark.parametrize("name", ["parens", "calls", "flat_sum", "else_if", "private_array"])
def test_structural_limits_refuse_the_deep_and_the_large_cheaply(name):
    started = time.perf_counter()
    with pytest.raises(KemError) as err:
        check_structure(ATTACKS[name])
    print(f"{name}: refused in {(time.perf_counter() - started) * 1e3:.1f} ms: {err.value.detail}")
    assert err.value.reason == "kernel_rejected"


def test_structural_limits_pass_kem_kernels_and_ordinary_ones():
    from kem_port.kernel_store import PACKAGED_KERNELS

    for path in PACKAGED_KERNELS.glob("*.wgsl"):
        check_structure(path.read_text())
    check_structure(kernel("out[g.x] = " + " + ".join(["inp[g.x]"] * 100) + ";", "var<private> p: array<u32, 4096>;\n"))


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    store = tmp_path_factory.mktemp("rejected")
    guard = CompileGuard(GuardSettings(timeout_s=4.0, memory_mb=512), RejectStore(store))
    yield guard
    guard.close()


def test_worker_refuses_what_structure_cannot_see_and_remembers_it_on_disk(guard):
    for name in ("private_array_const", "doubling_calls"):
        started = time.perf_counter()
        with pytest.raises(KemError) as err:
            guard.admit(source(name, ATTACKS[name]), MAIN)
        print(f"{name}: {err.value.detail} after {time.perf_counter() - started:.1f} s")
        assert err.value.reason == "kernel_rejected"
        # A fresh guard (a restarted port) over the same directory refuses at once.
        fresh = CompileGuard(guard.settings, RejectStore(guard.rejects.directory))
        with pytest.raises(KemError) as again:
            fresh.admit(source(name, ATTACKS[name]), MAIN)
        assert again.value.reason == "kernel_rejected" and "refused before" in again.value.detail
        assert fresh._worker is None  # no compile was needed to refuse it


def test_new_kernels_pay_one_worker_round_trip_known_ones_none(guard):
    rounds = []
    for k in range(5):
        text = kernel(f"out[g.x] = inp[g.x] * {k + 5}u;")
        started = time.perf_counter()
        admitted = guard.admit(source(f"k{k}", text), MAIN)
        rounds.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert guard.is_admitted(source(f"k{k}", text), MAIN) is admitted
        known = time.perf_counter() - started
    print(f"new kernel: {min(rounds) * 1e3:.1f}-{max(rounds) * 1e3:.1f} ms; known kernel lookup {known * 1e6:.1f} us")


def test_compile_errors_are_the_callers_and_not_remembered_on_disk(guard):
    with pytest.raises(KemError) as err:
        guard.admit(source("broken", kernel("out[g.x] = inp[g.x] * ;")), MAIN)
    assert err.value.reason == "shader_error"
    assert guard.rejects.lookup(source("broken", kernel("out[g.x] = inp[g.x] * ;")).sha256) is None


def test_reject_store_trusts_nothing_it_reads(tmp_path):
    store = RejectStore(tmp_path)
    sha = "ab" * 32
    (tmp_path / sha).write_bytes(b"x" * 100_000)
    assert len(store.lookup(sha)) == 512
    os.symlink("/etc/passwd", tmp_path / ("cd" * 32))
    assert store.lookup("cd" * 32) is None
    os.mkfifo(tmp_path / ("ef" * 32))
    assert store.lookup("ef" * 32) is None  # a FIFO neither hangs nor counts
    assert store.lookup("../" + sha) is None and store.lookup(sha + "\n") is None
    store.remember("12" * 32, "why")
    assert RejectStore(tmp_path).lookup("12" * 32) == "why"
    assert oct(os.stat(tmp_path / ("12" * 32)).st_mode & 0o777) == "0o600"


def test_hostile_kernels_through_the_port_leave_bystanders_served(kernel_dir, rng):
    for name, text in ATTACKS.items():
        (kernel_dir / f"{name}.wgsl").write_text(text)
    (kernel_dir / "triple.wgsl").write_text(TRIPLE)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache"), **GUARD_ENV) as port:
        pid = port.proc.pid

        def bystander(n: int) -> None:
            words = rng.integers(0, 2**32, n, dtype=np.uint32)
            kernel_id = b"double" if n % 2 else b"triple"
            factor = np.uint32(2 if n % 2 else 3)
            assert port.call("execute_kernel", kernel_id, words.tobytes(), 1) == (words * factor).tobytes()

        with ThreadPoolExecutor(8) as pool:
            flood = [pool.submit(bystander, n) for n in range(1, 400)]
            attacks = {name: pool.submit(port.call, "execute_kernel", name.encode(), bytes(256), 1) for name in ATTACKS}
            for name, fut in attacks.items():
                with pytest.raises(PortError) as err:
                    fut.result(120)
                print(f"{name}: {err.value.reason}: {err.value.detail}")
                assert err.value.reason == "kernel_rejected", name
                assert "/" not in err.value.detail  # reasons, not paths
            for fut in flood:
                fut.result(120)
        for name in ATTACKS:  # refused the second time from the record, without a compile
            with pytest.raises(PortError) as err:
                port.call("execute_kernel", name.encode(), bytes(256), 1)
            assert err.value.reason == "kernel_rejected" and "refused before" in err.value.detail
        stats = port.call("stats")
        assert stats[terms.atom("kernels_rejected")] == len(ATTACKS)
        assert stats[terms.atom("kernels_refused")] == len(ATTACKS)
        assert port.proc.pid == pid and port.proc.poll() is None
        bystander(1001)


def test_chain_kernels_are_admitted_like_call_kernels(kernel_dir, rng):
    """A chain (dev_kem's execute_chain, kem:chain) compiles its kernels
    through the same guard: an attack in step 2 is refused with the step's
    index, and the port keeps its pid and serves the next chain."""
    (kernel_dir / "parens.wgsl").write_text(ATTACKS["parens"])
    (kernel_dir / "doubling_calls.wgsl").write_text(ATTACKS["doubling_calls"])
    (kernel_dir / "triple.wgsl").write_text(TRIPLE)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache"), **GUARD_ENV) as port:
        pid = port.proc.pid
        words = rng.integers(0, 2**30, 64, dtype=np.uint32)
        for attack in ("parens", "doubling_calls"):
            with pytest.raises(PortError) as err:
                port.chain([{"kernel": "triple"}, {"kernel": attack}], input=words.tobytes())
            assert (err.value.reason, err.value.step) == ("kernel_rejected", 2), attack
        assert port.chain([{"kernel": "triple"}, {"kernel": "double"}], input=words.tobytes()) == (words * 6).tobytes()
        assert port.proc.pid == pid and port.proc.poll() is None


# -- the inlined-size bound (issue 24, item 5) ------------------------------

def nested_doubling(levels: int) -> str:
    """The red team's 1.3 KB kernel: f(k) calls f(k-1) twice, so main's code
    inlined is 2^levels copies of f0 (17 levels compiled for 9.6 s)."""
    helpers = "fn f0(x: u32) -> u32 { return x * 3u + 1u; }\n" + "".join(
        f"fn f{i}(x: u32) -> u32 {{ return f{i - 1}(f{i - 1}(x)); }}\n" for i in range(1, levels + 1))
    return kernel(f"out[g.x] = f{levels}(inp[g.x]);", helpers)


HELPERS = kernel(
    "let v = inp[g.x];\n    out[g.x] = mix3(rotl(v, 5u), rotl(v, 13u), clamp_add(v, 7u)) ^ clamp_add(rotl(v, 1u), 3u);",
    "fn rotl(x: u32, n: u32) -> u32 { return (x << n) | (x >> (32u - n)); }\n"
    "fn clamp_add(x: u32, y: u32) -> u32 { return select(x + y, 0xffffffffu, x > 0xffffffffu - y); }\n"
    "fn mix3(a: u32, b: u32, c: u32) -> u32 { return rotl(a ^ b, 7u) + clamp_add(b, c) * 9u; }\n")


def helpers_reference(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint64)
    m = np.uint64(0xFFFFFFFF)

    def rotl(x, n):
        return ((x << np.uint64(n)) | (x >> np.uint64(32 - n))) & m

    def clamp_add(x, y):
        y = np.uint64(y) if np.isscalar(y) else y
        return np.where(x > m - y, m, (x + y) & m)

    def mix3(a, b, c):
        return (rotl(a ^ b, 7) + (clamp_add(b, c) * np.uint64(9)) & m) & m

    return (mix3(rotl(v, 5), rotl(v, 13), clamp_add(v, 7)) ^ clamp_add(rotl(v, 1), 3)).astype("<u4")


def test_nested_doubling_refused_in_milliseconds_by_its_inlined_size():
    for levels in (11, 17, 40):
        started = time.perf_counter()
        with pytest.raises(KemError) as err:
            check_structure(nested_doubling(levels))
        took = time.perf_counter() - started
        print(f"{levels} levels: refused in {took * 1e3:.1f} ms: {err.value.detail}")
        assert err.value.reason == "kernel_rejected"
        assert "inlined" in err.value.detail and "main" in err.value.detail
        assert took < 3.0  # the compile it replaces took 9.6 s at 17 levels
    check_structure(nested_doubling(8))  # 2^8 copies of a one-line helper: still a small kernel
    check_structure(HELPERS)


def test_nested_doubling_refused_through_the_port_while_bystanders_are_served(kernel_dir, rng):
    (kernel_dir / "doubling17.wgsl").write_text(nested_doubling(17))
    (kernel_dir / "helpers.wgsl").write_text(HELPERS)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache"), **GUARD_ENV) as port:
        for n in (1, 17, 1000, 4096):  # a kernel with helper functions is admitted, and right
            words = rng.integers(0, 2**32, n, dtype=np.uint32)
            assert port.call("execute_kernel", b"helpers", words.tobytes(), 1) == helpers_reference(words).tobytes()
        with ThreadPoolExecutor(4) as pool:
            started = time.perf_counter()
            attack = pool.submit(port.call, "execute_kernel", b"doubling17", bytes(256), 1)
            for n in (3, 64, 999):
                words = rng.integers(0, 2**32, n, dtype=np.uint32)
                assert port.call("execute_kernel", b"double", words.tobytes(), 1) == (words * np.uint32(2)).tobytes()
            with pytest.raises(PortError) as err:
                attack.result(30)
            took = time.perf_counter() - started
        print(f"refused in {took:.2f} s: {err.value.detail}")
        assert err.value.reason == "kernel_rejected" and "inlined" in err.value.detail
        assert took < 6.0  # compiling it took 9.6 s
        with pytest.raises(PortError) as again:
            port.call("execute_kernel", b"doubling17", bytes(256), 1)
        assert "refused before" in again.value.detail


# Compatibility sweep (issue 25): the inlined-size bound counted a large
# function with no calls at all (a generated kernel: a 4,200-case switch,
# 170 KB, ~67,000 nodes, compiled in 1.4 s on lavapipe; a real game's
# 72,532-node fragment shader) as an inlining blow-up and refused it. The
# bound is on what inlining adds; the node and depth limits and the
# compile deadline keep bounding a large kernel's own size.
FLAT_CASES = 4200


def flat_switch(cases: int) -> str:
    arms = "\n".join(f"        case {k}u: {{ v = {(k * 2654435761) % 2**32}u; }}" for k in range(cases))
    return kernel(f"var v = 0u;\n    switch (inp[g.x] % {cases}u) {{\n{arms}\n        default: {{ v = 1u; }}\n    }}\n    out[g.x] = v;")


def test_a_large_kernel_without_calls_is_no_inlining_bomb(kernel_dir, rng):
    source = flat_switch(FLAT_CASES)
    check_structure(source)
    (kernel_dir / "flat_switch.wgsl").write_text(source)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        for n in (1, 333, 5000):
            words = rng.integers(0, 2**32, n, dtype=np.uint32)
            keys = (words % FLAT_CASES).astype(np.uint64)
            want = ((keys * 2654435761) % 2**32).astype("<u4")
            assert port.call("execute_kernel", b"flat_switch", words.tobytes(), 1) == want.tobytes()


# may_loop (gpu/wgsl_calls.py) answered "may loop" for every kernel
# tree-sitter's grammar cannot fully parse (module-scope `const`, a
# `workgroupBarrier();` statement, `alias`, typed literals such as `1li`):
# 827 of 2,489 valid compute entry points of the sweep's corpus had no loop
# token at all yet were kept off the reader. Without a loop, call or no
# call, nothing runs long (WGSL has no recursion and no goto).
NO_LOOP_UNPARSED = HEAD + """const SCALE: u32 = 3u;
alias Word = u32;
var<workgroup> staged: array<Word, 64>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) i: u32) {
    staged[i] = inp[min(g.x, arrayLength(&inp) - 1u)] * SCALE;
    workgroupBarrier();
    if (g.x < arrayLength(&out)) { out[g.x] = staged[i] + staged[63u - i]; }
}
"""


def test_a_loop_free_kernel_tree_sitter_cannot_parse_may_not_loop(kernel_dir, rng):
    from kem_port.gpu.wgsl.wgsl_calls import may_loop
    from kem_port.gpu.wgsl.wgsl_canonical import canonical

    text = canonical(NO_LOOP_UNPARSED)
    assert may_loop(text, "no-loop-unparsed", "main") is False
    looping = text.replace("workgroupBarrier();", "workgroupBarrier(); for (var k = 0u; k < 2u; k++) { }")
    assert may_loop(looping, "loop-unparsed", "main") is True
    assert may_loop(text, "no-loop-unparsed-missing-entry", "absent") is True
    (kernel_dir / "no_loop.wgsl").write_text(NO_LOOP_UNPARSED)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        for groups in (1, 3, 16):
            words = rng.integers(0, 2**30, 64 * groups, dtype=np.uint32)
            blocks = words.reshape(groups, 64) * np.uint32(3)
            want = (blocks + blocks[:, ::-1]).astype("<u4").tobytes()
            assert port.call("execute_kernel", b"no_loop", words.tobytes(), 1) == want


# -- a refusal is remembered only when confirmed (issue 24 follow-up) --------
#
# A worker that died, ran past its deadline or broke while compiling a kernel
# wrote the kernel's sha256 to the refusal store for good. Under load (a
# stranger flooding a 2-core node) a valid kernel's compile, or the health
# probe after it, could miss a wall deadline: that kernel was then refused on
# the node forever ("exhausted the compile worker's resource limits" was seen
# for a normal kernel). The test hook fails the first compile of the next new
# kernel as load or a worn worker would.
SEVEN = kernel("out[g.x] = inp[g.x] * 7u + 1u;")


@pytest.mark.parametrize("fault", ["crash", "stall", "break"])
def test_a_valid_kernel_whose_first_compile_fails_is_compiled_again_not_refused(kernel_dir, rng, fault):
    (kernel_dir / "seven.wgsl").write_text(SEVEN)
    (kernel_dir / "bomb.wgsl").write_text(ATTACKS["private_array_const"])
    rejected = kernel_dir / "cache" / "rejected"
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache"),
                    KEM_COMPILE_TIMEOUT_MS="2000", KEM_COMPILE_MEMORY_MB="512") as port:
        pid = port.proc.pid
        assert port.call("test_hook", terms.atom("fail_next_compile"), terms.atom(fault)) == terms.atom("ok")
        for n in (1, 333, 4099):
            words = rng.integers(0, 2**32, n, dtype=np.uint32)
            assert port.call("execute_kernel", b"seven", words.tobytes(), 1) == (words * np.uint32(7) + np.uint32(1)).tobytes()
        assert not (rejected / source("seven", SEVEN).sha256).exists()
        assert port.call("stats")[terms.atom("compiles_retried")] == 1
        # A real bomb fails twice, and only then is refused and remembered.
        with pytest.raises(PortError) as err:
            port.call("execute_kernel", b"bomb", bytes(256), 1)
        assert err.value.reason == "kernel_rejected", err.value
        assert (rejected / source("bomb", ATTACKS["private_array_const"]).sha256).exists()
        assert port.call("stats")[terms.atom("compiles_retried")] == 2
        words = rng.integers(0, 2**32, 77, dtype=np.uint32)
        assert port.call("execute_kernel", b"double", words.tobytes(), 1) == (words * np.uint32(2)).tobytes()
        assert port.proc.pid == pid and port.proc.poll() is None
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        words = rng.integers(0, 2**32, 500, dtype=np.uint32)  # a restarted port: still admitted, still right
        assert port.call("execute_kernel", b"seven", words.tobytes(), 1) == (words * np.uint32(7) + np.uint32(1)).tobytes()


def test_an_unconfirmed_failure_is_a_retryable_overloaded_and_not_remembered(tmp_path, monkeypatch):
    """No fresh worker to confirm in (here: one that cannot open its
    adapter): the caller gets `overloaded` (try later), nothing is written,
    and once a worker starts again the kernel is admitted."""
    monkeypatch.setenv("KEM_TEST_HOOKS", "1")  # the worker honours fail_next_compile only then
    guard = CompileGuard(GuardSettings(timeout_s=2.0, memory_mb=512), RejectStore(tmp_path))
    try:
        guard.start()
        guard._ready_worker()  # the first attempt's worker is healthy
        seven = source("seven", SEVEN)
        guard.fail_next_compile("crash")
        guard._slot.settings = GuardSettings(timeout_s=2.0, memory_mb=512, adapter="no-such-adapter")
        with pytest.raises(KemError) as err:
            guard.admit(seven, MAIN)
        assert err.value.reason == "overloaded" and "not refused" in err.value.detail, err.value
        assert guard.rejects.lookup(seven.sha256) is None and not (tmp_path / seven.sha256).exists()
        guard._slot.settings = guard.settings
        assert guard.admit(seven, MAIN).sha256 == seven.sha256
    finally:
        guard.close()
