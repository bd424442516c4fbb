"""Third red team of issue 24: the debug channel, pooled and kit buffers,
disclosure and the test hook, through a real port on real wgpu.

Findings (each test failed before its fix):
* the compile guard kept one admitted copy of a kernel's text per
  (entry point, params or not, session): a stranger's execute_chain may
  name any entry point, so one published 1 MiB kernel with many compute
  entry points grew the port by ~4-6 MB an admission (134 -> 205 MB after
  12, lavapipe), without bound; now one copy per kernel;
* dev_kem's info (any HTTP client) gave every port's OS pid, which tells a
  stranger when other callers' work restarted a port
  (erlang/kem/test/kem_health_tests.erl).

Held (regression tests below):
* a debug call's channel is fresh zeros: a kernel reading the channel
  without writing sees count 0 and no record of the caller before it, who
  wrote 2,000 random secrets there;
* a kernel whose uniform the reflection cannot size (an array behind a
  `const`) asks for 16 KiB of a 256-byte params binding: its calls are a
  `gpu_error`, each its own; bystanders' doublings mixed into the same
  bursts are all exact (240 of 240 in the probe);
* without KEM_TEST_HOOKS=1 `test_hook` is `unknown_method`; `config`,
  `adapter_info`, `stats`, `health`, `call_state` and the refusals of
  path-like kernel ids name no directory of the node;
* outputs from 64 KiB + 4 bytes to 8 MiB + 12 (past the lone kit's and the
  queue-write zeroing's 64 KiB) that a kernel never writes come back as
  zeros of exactly the asked length on every road (plain, odd size, debug,
  session call, chain), right after callers filled same-class buffers with
  secrets;
* a uniform of 256 bytes the reflection cannot size (behind a `const`),
  sent 4 to 252 bytes of params: the rest reads as zeros on every road
  (lone kit, batch, debug, session call, chain) while other callers send
  secrets as their params.
"""

from __future__ import annotations

import numpy as np

from conftest import start_port
from kem_port.admission.guard import CompileGuard, GuardSettings
from kem_port.admission.rejects import RejectStore
from kem_port.gpu.calls import KernelCall
from kem_port.kernel_store import source_from_bytes
from kem_port.wire import terms
from kem_port.client import PortClient, PortError, plain

A = terms.atom

CHANNEL = "struct KemDebug { count: atomic<u32>, records: array<u32> }\n"
BINDINGS = """
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
"""
DEBUG_BINDING = "@group(0) @binding(15) var<storage, read_write> kem_debug: KemDebug;\n"

# Writes every input word as a record (the "victim" of the debug channel).
DBG_WRITE = CHANNEL + BINDINGS + DEBUG_BINDING + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i];
    let j = atomicAdd(&kem_debug.count, 1u);
    if (j < arrayLength(&kem_debug.records)) { kem_debug.records[j] = input_words[i]; }
}
"""

# Reads the channel without writing it: word 0 the count, then the records.
DBG_READ = CHANNEL + BINDINGS + DEBUG_BINDING + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    if (i == 0u) { output_words[0] = atomicLoad(&kem_debug.count); return; }
    if (i - 1u < arrayLength(&kem_debug.records)) { output_words[i] = kem_debug.records[i - 1u]; }
}
"""

# A uniform the reflection cannot size (N is a const): 16 KiB read through
# a params binding of 256 bytes when the caller sends 16.
BIG_UNIFORM = "const N: u32 = 1024u;\n" + BINDINGS + """
@group(0) @binding(2) var<uniform> p: array<vec4<u32>, N>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = p[i / 4u][i % 4u];
}
"""


def _debug_call(port: PortClient, kernel: bytes, data: bytes, **opts) -> tuple[np.ndarray, dict]:
    options = {A("debug"): True, **{A(k): v for k, v in opts.items()}}
    out, records = port.call("execute", kernel, data, options)
    return np.frombuffer(terms.binary_bytes(out), "<u4"), plain(records)


def test_a_debug_call_never_sees_the_previous_callers_records(kernel_dir, rng):
    (kernel_dir / "dbg_write.wgsl").write_text(DBG_WRITE)
    (kernel_dir / "dbg_read.wgsl").write_text(DBG_READ)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        for n in (1, 37, 2000, 5000):
            secrets = rng.integers(1, 2**32, n, dtype=np.uint32)
            out, debug = _debug_call(port, b"dbg_write", secrets.tobytes())
            assert np.array_equal(out, secrets)
            kept = min(n, debug["capacity"])
            assert sorted(debug["records"]) == sorted(secrets.tolist())[:kept] or len(debug["records"]) == kept
            assert debug["dropped"] == n - kept
            seen, debug = _debug_call(port, b"dbg_read", bytes(4), output_size=4 * (1 + 4096 + 8))
            assert seen[0] == 0 and not seen[1:].any(), f"{np.isin(seen, secrets).sum()} secret words read back"
            assert debug["records"] == [] and debug["dropped"] == 0


def test_an_undersized_uniform_fails_only_its_own_calls(kernel_dir, rng):
    (kernel_dir / "big_uniform.wgsl").write_text(BIG_UNIFORM)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        full = rng.integers(0, 2**32, 4096, dtype=np.uint32)
        got = port.call("execute", b"big_uniform", bytes(64), {A("params"): full.tobytes()})
        assert np.array_equal(np.frombuffer(got, "<u4"), full[:16])
        outcomes = []
        for _ in range(8):
            burst = []
            for j in range(9):
                if j % 3 == 1:
                    burst.append((None, port.call_async("execute", b"big_uniform", bytes(64), {A("params"): bytes(16)})))
                else:
                    words = rng.integers(0, 2**31, int(rng.integers(1, 300)), dtype=np.uint32)
                    burst.append(((words * 2).astype("<u4").tobytes(), port.call_async("execute_kernel", b"double", words.tobytes(), 1)))
            for want, future in burst:
                try:
                    got = future.result(30)
                    outcomes.append(("victim", got == want) if want else ("attacker", "ran"))
                except PortError as exc:
                    outcomes.append(("victim" if want else "attacker", exc.reason))
        assert {o for o in outcomes if o[0] == "victim"} == {("victim", True)}
        assert {o for o in outcomes if o[0] == "attacker"} == {("attacker", "gpu_error")}
        assert port.call("ping") == A("pong")


def test_no_test_hook_and_no_paths_in_answers(kernel_dir):
    (kernel_dir / "dbg_write.wgsl").write_text(DBG_WRITE)
    cache = kernel_dir / "cache"
    with PortClient({"KEM_KERNEL_DIR": str(kernel_dir), "KEM_CACHE_DIR": str(cache)}) as port:
        try:
            port.call("test_hook", A("fail_next_compile"), A("crash"))
            raise AssertionError("test_hook ran without KEM_TEST_HOOKS=1")
        except PortError as exc:
            assert exc.reason == "unknown_method"
        answers = [repr(port.call(m)) for m in ("config", "adapter_info", "stats", "health")]
        answers.append(repr(port.call("call_state", 1)))
        for kid in (b"../dbg_write", str(kernel_dir / "dbg_write").encode(), b"dbg_write.wgsl"):
            try:
                port.call("execute_kernel", kid, bytes(8), 1)
                raise AssertionError(f"{kid!r} ran")
            except PortError as exc:
                assert exc.reason == "invalid_kernel_id"
                # The caller's own id is quoted back, cut at 80 characters
                # (wire/protocol.py): a path over 80 (xdist's tmp_path adds
                # "popen-gw1/") is quoted in part, so cut it as the port does.
                answers.append(str(exc.detail).replace(kid.decode()[:80], "<id>"))
        for text in answers:
            assert str(kernel_dir) not in text and str(cache) not in text and "/tmp" not in text


NOOP = BINDINGS + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x == 0xffffffffu) { output_words[0] = input_words[0]; }
}
"""


def test_large_unwritten_outputs_are_zeros_on_every_road(kernel_dir, rng):
    (kernel_dir / "noop.wgsl").write_text(NOOP)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        session = port.session_open()
        roads = {
            "plain": lambda n: port.call("execute", b"noop", bytes(4), {A("output_size"): n}),
            "odd": lambda n: port.call("execute", b"noop", bytes(4), {A("output_size"): n - 1}),
            "debug": lambda n: port.call("execute", b"noop", bytes(4), {A("output_size"): n, A("debug"): True})[0],
            "session": lambda n: session.call("noop", bytes(4), output_size=n),
            "chain": lambda n: port.chain([{"kernel": "noop", "output_size": n}], bytes(4)),
        }
        for size in (65536 + 4, 200_000, (3 << 20) + 8, (8 << 20) + 12):
            secrets = rng.integers(1, 2**32, size // 4, dtype=np.uint32)
            want = (secrets * 2).astype("<u4").tobytes()
            for future in [port.call_async("execute_kernel", b"double", secrets.tobytes(), 1) for _ in range(3)]:
                assert future.result(120) == want
            for road, run in roads.items():
                got = run(size)
                out = got if isinstance(got, bytes) else terms.binary_bytes(got)
                assert len(out) == (size - 1 if road == "odd" else size), road
                assert not any(out), f"{road}: {np.count_nonzero(np.frombuffer(out[: len(out) // 4 * 4], '<u4'))} words not zero"


U256 = "const N: u32 = 16u;\n" + BINDINGS + """
@group(0) @binding(2) var<uniform> p: array<vec4<u32>, N>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = p[(i / 4u) % N][i % 4u];
}
"""


def test_short_params_pad_with_zeros_on_every_road(kernel_dir, rng):
    (kernel_dir / "u256.wgsl").write_text(U256)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        session = port.session_open()
        for length in (4, 12, 20, 100, 252):
            secrets = rng.integers(1, 2**32, 64, dtype=np.uint32)
            victims = [port.call_async("execute", b"u256", bytes(256), {A("params"): secrets.tobytes()}) for _ in range(3)]
            mine = rng.integers(1, 2**32, length // 4, dtype=np.uint32)
            want = np.zeros(64, np.uint32)
            want[: length // 4] = mine
            params = {A("params"): mine.tobytes()}
            roads = {
                "lone": lambda: port.call("execute", b"u256", bytes(256), params),
                "batch": lambda: [f.result(60) for f in [port.call_async("execute", b"u256", bytes(256), params) for _ in range(4)]],
                "debug": lambda: [port.call("execute", b"u256", bytes(256), {**params, A("debug"): True})[0]],
                "session": lambda: session.call("u256", bytes(256), params=mine.tobytes()),
                "chain": lambda: port.chain([{"kernel": "u256", "params": mine.tobytes(), "output_size": 256}], bytes(256)),
            }
            for road, run in roads.items():
                got = run()
                for out in got if isinstance(got, list) else [got]:
                    seen = np.frombuffer(out if isinstance(out, bytes) else terms.binary_bytes(out), "<u4")
                    assert np.array_equal(seen, want), f"{road}: {np.isin(seen, secrets).sum()} secret words"
            for future in victims:
                assert np.array_equal(np.frombuffer(future.result(60), "<u4"), secrets)


def _many_entries(entries: int, pad: int) -> bytes:
    """One kernel, a workgroup array (so the clearing rewrites it) and
    `entries` compute entry points, padded by a comment to `pad` bytes."""
    body = "".join(
        f"@compute @workgroup_size(64) fn e{i}(@builtin(local_invocation_index) l: u32) "
        f"{{ w[l] = {i}u; workgroupBarrier(); output_words[l] = w[63u - l]; }}\n"
        for i in range(entries)
    )
    return ("var<workgroup> w: array<u32, 64>;\n" + BINDINGS + "// " + "x" * pad + "\n" + body).encode()


def test_entry_points_of_one_kernel_share_one_admitted_text(tmp_path):
    """Each (entry point, shape) is admitted on its own; the text kem keeps
    for them must be one copy, or a caller choosing entry points grows the
    port by the kernel's size each time."""
    source = source_from_bytes("many", _many_entries(8, 200_000), "local", "local")
    guard = CompileGuard(GuardSettings(timeout_s=20.0, memory_mb=512), RejectStore(tmp_path))
    try:
        admitted = [guard.admit_for_session(source, f"e{i}") for i in range(6)]
        admitted += [guard.admit(source, KernelCall("many", bytes(256), 256, None, None, f"e{i}")) for i in (6, 7)]
    finally:
        guard.close()
    kept = {id(a.text): len(a.text) for a in admitted}
    assert all("workgroupBarrier" in a.text and a.text == admitted[0].text for a in admitted)
    assert sum(kept.values()) <= len(admitted[0].text), f"{len(kept)} copies of a {len(admitted[0].text)}-byte text"
