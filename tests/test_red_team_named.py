"""Red team of the run method (issue 25): a kernel called by named buffers.
Hostile calls through the real port; every reuse of a kit must keep one
caller's bytes from another, and every hostile term is answered."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import call_state, kernels_port, sent, start_port, wait_running
from test_request_budgets import SPIN, spin_input, spin_reference
from kem_port.client import PortError
from kem_port.wire import terms

KERNELS = {
    # reads a fixed-size array: 64 words whatever the binding's size
    "fixed_in": """
@group(0) @binding(0) var<storage, read> a: array<u32, 64>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&out)) { out[i] = a[i]; }
}
""",
    "fixed_out": """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    out[i] = out[i] + 1u;
}
""",
    # copies a whole in/out buffer and a whole uniform out: nothing of a previous caller may show
    "copy_all": """
struct U { v: array<vec4<u32>, 4> }
@group(0) @binding(0) var<uniform> u: U;
@group(0) @binding(1) var<storage, read_write> io: array<u32>;
@group(0) @binding(2) var<storage, read_write> seen: array<u32>;
@compute @workgroup_size(1)
fn main() {
    for (var i = 0u; i < 16u; i++) { seen[i] = u.v[i / 4u][i % 4u]; }
    for (var i = 0u; i < arrayLength(&io); i++) { seen[16u + i] = io[i]; io[i] = io[i] + 0u; }
}
""",
    "uni_mat": """
@group(0) @binding(0) var<uniform> m: mat4x4<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main() { for (var i = 0u; i < 16u; i++) { out[i] = m[i / 4u][i % 4u]; } }
""",
    "two_entries": """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(0) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(1)
fn first() { }
@compute @workgroup_size(1)
fn second() { b[0] = 7u; }
""",
    "atomics": """
@group(0) @binding(0) var<storage, read_write> counter: array<atomic<u32>>;
@compute @workgroup_size(64)
fn main() { atomicAdd(&counter[0], 1u); }
""",
    "storage_tex": """
@group(0) @binding(0) var img: texture_storage_2d<rgba8unorm, write>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { textureStore(img, vec2<i32>(0, 0), vec4<f32>(1.0)); out[0] = 1u; }
""",
    "sampler": """
@group(0) @binding(0) var s: sampler;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { out[0] = 1u; }
""",
    "group5": """
@group(5) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { out[0] = 1u; }
""",
    "huge_binding": """
@group(0) @binding(4000000000) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { out[0] = 1u; }
""",
    "vec4_out": """
@group(0) @binding(0) var<storage, read_write> out: array<vec4<u32>>;
@compute @workgroup_size(1)
fn main() { for (var i = 0u; i < arrayLength(&out); i++) { out[i] = vec4<u32>(i + 1u); } }
""",
    # each ALPHA its own pipeline; `big` makes a shape over KIT_BYTES (never kept as a kit)
    "shift": """
override ALPHA: f32 = 0.0;
@group(0) @binding(0) var<storage, read_write> ys: array<f32>;
@group(0) @binding(1) var<storage, read_write> big: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&ys)) { ys[i] = ys[i] + ALPHA; }
    if (i == 0u) { big[0] = 1u; }
}
""",
    "spin_cold": SPIN.replace("x ^= x << 13u", "x ^= x << 12u"),  # never warmed: call_state while admitting
    "spin": SPIN,  # test_request_budgets: input[1] rounds of an unrolled xorshift per invocation
}


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("red_named"), KERNELS) as p:
        yield p


def run(port, kernel: str, buffers: dict, **opts) -> dict[str, bytes]:
    named = {k.encode() if isinstance(k, str) else k: v for k, v in buffers.items()}
    if "outputs" in opts:
        opts["outputs"] = {k.encode() if isinstance(k, str) else k: v for k, v in opts["outputs"].items()}
    got = port.call("run", kernel.encode(), named, opts)
    return {terms.binary_bytes(k).decode(): terms.binary_bytes(v) for k, v in got.items()}


def test_a_storage_buffer_shorter_than_its_fixed_size_type_is_bad_args_naming_it(port):
    """BEFORE (red team): 4 bytes for `array<u32, 64>` was allocated, encoded and refused by wgpu as
    gpu_error, its text wgpu's internals ("In wgpuCommandEncoderFinish ... bound with size 4 where the
    shader expects 256"); docs/kernels.md promises bad_args naming the buffer before anything runs."""
    for kernel, buffers, outputs, name in (("fixed_in", {"a": b"\0" * 4}, {"out": 256}, "'a'"),
                                           ("fixed_out", {"a": b"\0" * 4}, {"out": 4}, "'out'")):
        with pytest.raises(PortError) as err:
            run(port, kernel, buffers, outputs=outputs, workgroups=(1, 1, 1))
        assert err.value.reason == "bad_args", err.value
        assert name in err.value.detail and "256" in err.value.detail and "wgpu" not in err.value.detail
    secret = bytes(range(1, 256)) + b"\x01"
    got = run(port, "fixed_in", {"a": secret}, outputs={"out": 256}, workgroups=(1, 1, 1))
    assert got["out"] == secret


def test_an_output_of_part_of_an_element_is_refused_not_padded_with_zeros(port):
    """BEFORE (red team): 20 bytes for `array<vec4<u32>>` ran with arrayLength 1, and the caller got
    16 computed bytes and 4 zero bytes the kernel never wrote, as if they were its answer."""
    assert run(port, "vec4_out", {}, outputs={"out": 32}, workgroups=(1, 1, 1))["out"] == \
        np.repeat(np.array([1, 2], np.uint32), 4).tobytes()
    for size in (20, 8):
        with pytest.raises(PortError) as err:
            run(port, "vec4_out", {}, outputs={"out": size}, workgroups=(1, 1, 1))
        assert err.value.reason == "bad_args" and "'out'" in err.value.detail and "16-byte" in err.value.detail, err.value
    with pytest.raises(PortError) as err:  # in place too: 4 of the caller's bytes were silently ignored
        run(port, "vec4_out", {"out": b"\1" * 20}, workgroups=(1, 1, 1))
    assert err.value.reason == "bad_args" and "'out'" in err.value.detail


def test_a_key_that_is_not_a_name_is_answered_as_the_caller_wrote_it(port):
    """BEFORE (red team): the detail read `"OtpErlangBinary(b'0/4000000000',bits=8)" is not a buffer
    name`: the port's own Python types, not the caller's term."""
    with pytest.raises(PortError) as err:
        run(port, "atomics", {"0/4000000000": b"\0" * 4}, workgroups=(1, 1, 1))
    assert err.value.reason == "bad_args"
    assert "OtpErlang" not in err.value.detail and "0/4000000000" in err.value.detail, err.value.detail


def test_reused_kits_never_show_a_previous_callers_uniform_in_out_or_output_bytes(port):
    secret_u, secret_io = bytes(range(100, 164)), b"\xee" * 24
    first = run(port, "copy_all", {"u": secret_u, "io": secret_io}, outputs={"seen": 160}, workgroups=(1, 1, 1))
    assert first["seen"][:64] == secret_u and first["seen"][64:88] == secret_io
    # the same padded shape (io 21..24 bytes -> 24 bound), a shorter in/out and a larger uniform
    u = b"\1" * 64
    got = run(port, "copy_all", {"u": u, "io": b"\2" * 21}, outputs={"seen": 160}, workgroups=(1, 1, 1))
    assert got["seen"][:64] == u
    assert got["seen"][64:88] == b"\2" * 21 + bytes(3) and got["seen"][88:] == bytes(72)
    assert got["io"] == b"\2" * 21


def test_a_reused_kit_returns_this_callers_lengths(port):
    """BEFORE (red team): a kit kept its maker's lengths: after a 24-byte call, a 21-byte in/out buffer
    came back as 24 bytes, and after a 21-byte call a 24-byte one came back cut to 21."""
    for n in (24, 21, 22, 24, 21):
        got = run(port, "copy_all", {"u": b"\1" * 64, "io": bytes([n]) * n}, outputs={"seen": 160}, workgroups=(1, 1, 1))
        assert got["io"] == bytes([n]) * n
    for n in (28, 25, 28):
        got = run(port, "copy_all", {"u": b"\1" * 64, "io": b"\3" * 4}, outputs={"seen": n}, workgroups=(1, 1, 1))
        assert len(got["seen"]) == n


HOSTILE = [
    ({10**5000: b"\0" * 4}, {}, "too_large"),
    ({(1, 2): b"\0" * 4}, {}, "bad_args"),
    ({1.0: b"\0" * 4}, {}, "bad_frame"),  # a float map key: etf_guard (1.0 == 1 in a dict, test_red_team_run3)
    ({b"counter": {b"x": b"y"}}, {}, "bad_args"),
    ({b"counter": [1, 2]}, {}, "bad_args"),
    ({terms.atom("counter"): b"\0" * 4, b"counter": b"\0" * 4}, {}, "bad_args"),
    ({0: b"\0" * 4, b"0": b"\0" * 4}, {}, "bad_args"),
    ({0: b"\0" * 4, b"0/0": b"\0" * 4}, {}, "bad_args"),
    ({b"c\xffounter": b"\0" * 4}, {}, "bad_args"),
    ({b"counter": b"\0" * 4}, {"outputs": {b"counter": 10**5000}}, "too_large"),
    ({b"counter": b"\0" * 4}, {"outputs": [1]}, "bad_args"),
    ({b"counter": b"\0" * 4}, {"entry_point": b"nope"}, "bad_kernel"),
    ({b"counter": b"\0" * 4}, {"constants": {b"X": 1}}, "bad_args"),
    ({b"counter": b"\0" * 4}, {"grid": (1, 1)}, "bad_args"),
    ({b"counter": b"\0" * 4}, {"workgroups": (2**63, 1, 1)}, "too_large"),
    ({str(i).encode(): b"" for i in range(65)}, {}, "bad_frame"),  # the decoder's bound on a map
]


@pytest.mark.parametrize("buffers, opts, reason", HOSTILE)
def test_hostile_terms_are_answered_and_the_port_lives(port, buffers, opts, reason):
    opts = {"workgroups": (1, 1, 1), **opts}
    with pytest.raises(PortError) as err:
        port.call("run", b"atomics", buffers, opts)
    assert err.value.reason == reason, err.value
    assert "Traceback" not in err.value.detail and "OtpErlang" not in err.value.detail, err.value.detail
    assert port.call("ping") == terms.atom("pong")


def test_textures_samplers_high_groups_and_clashing_entry_points_are_refused(port):
    for kernel, outputs in (("storage_tex", {"out": 4}), ("group5", {"out": 4}), ("huge_binding", {"out": 4})):
        with pytest.raises(PortError) as err:
            run(port, kernel, {}, outputs=outputs, workgroups=(1, 1, 1))
        assert err.value.reason == "bad_kernel", err.value
    # A sampler the entry point never uses is not bound (as WebGPU's "auto" layout leaves it out).
    assert run(port, "sampler", {}, outputs={"out": 4}, workgroups=(1, 1, 1))["out"] == (1).to_bytes(4, "little")
    assert run(port, "atomics", {"counter": b"\0" * 4}, workgroups=(3, 1, 1))["counter"] == (192).to_bytes(4, "little")


def test_a_run_past_its_deadline_in_the_queue_is_answered_timeout_not_run(port):
    """BEFORE (red team): a run queued behind a long one ran to its end long after its caller's
    timeout (execute's jobs are answered `timeout` unrun: gpu_loop's deadline check)."""
    opts = {"outputs": {b"output": 16 << 10}, "workgroups": (64, 1, 1)}  # 4,096 invocations
    got = run(port, "spin", {"input": spin_input(20, 7)}, outputs={"output": 16 << 10}, workgroups=(64, 1, 1))
    assert got["output"] == spin_reference(20, 7, 4096)
    long_id, long = sent(port, "run", b"spin", {b"input": spin_input(20000, 1)}, opts)  # ~1 s on lavapipe
    wait_running(port, long_id)  # else `late` could be read in time and gathered into its batch
    late = port.call_async("run", b"spin", {b"input": spin_input(20000, 2)}, opts, timeout_ms=50)
    with pytest.raises(PortError) as err:
        late.result(60)
    assert err.value.reason == "timeout" and "queue" in err.value.detail, err.value
    long.result(60)


def test_call_state_says_running_for_a_long_run_and_queued_behind_it(port):
    """Held: call_state of a run on the GPU thread and of one queued behind it (run_methods tags both)."""
    run(port, "spin", {"input": spin_input(1, 7)}, outputs={"output": 16 << 10}, workgroups=(64, 1, 1))  # admitted
    opts = {"outputs": {b"output": 16 << 10}, "workgroups": (64, 1, 1)}
    ids = port.next_req_ids(2)
    frames = []
    for r in ids:  # the second once the first runs: queued together, they would run together (gpu_loop._gather)
        frames.append(port.call_raw_frame(terms.encode(port._request(r, "run", (b"spin", {b"input": spin_input(20000, r)}, opts), 600_000)), [r])[0])
        deadline = time.monotonic() + 30
        while call_state(port, ids[0]) != "running" and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(0.2)
    assert [call_state(port, r) for r in ids] == ["running", "queued"]
    for f in frames:
        f.result(60)


def test_call_state_says_admitting_while_a_runs_new_kernel_compiles_in_the_guard(tmp_path):
    """BEFORE (red team): `unknown` ("the port holds no such call") for the ~1 s lavapipe spends
    admitting a port's first kernel (the guard's worker starting), where execute's calls say
    `admitting`: a node whose timer fires then is told the call is gone."""
    (tmp_path / "spin_cold.wgsl").write_text(KERNELS["spin_cold"])
    with start_port(KEM_KERNEL_DIR=str(tmp_path), KEM_CACHE_DIR=str(tmp_path / "cache")) as port:
        _watch_admission(port)


def _watch_admission(port) -> None:
    req_id = port.next_req_ids(1)[0]
    opts = {"outputs": {b"output": 16 << 10}, "workgroups": (64, 1, 1)}
    frame = port.call_raw_frame(terms.encode(port._request(req_id, "run", (b"spin_cold", {b"input": spin_input(1, 3)}, opts), 600_000)), [req_id])[0]
    seen = []
    while not frame.done():
        seen.append(call_state(port, req_id))
        time.sleep(0.05)
    assert "admitting" in seen and seen[-1] == "running", (seen, frame.exception())
    frame.result(60)


def test_a_kept_kit_outlives_its_pipeline(port):
    """Held: 64 other constants sets of the kernel (each its own pipeline, none kept as a kit: 4 MiB + 4
    bytes each) push the first set's pipeline out of the cache of 64 while its kit stays; the kit's bind
    groups, made with the first pipeline's layouts, still serve the new pipeline (WebGPU: group-equivalent
    layouts), and the result is right."""
    ys = np.arange(16, dtype=np.float32)
    first = run(port, "shift", {"ys": ys.tobytes()}, outputs={"big": 4}, workgroups=(1, 1, 1), constants={"ALPHA": 0.5})
    np.testing.assert_array_equal(np.frombuffer(first["ys"], np.float32), ys + 0.5)
    for k in range(1, 66):
        got = run(port, "shift", {"ys": b"\0" * 4}, outputs={"big": (4 << 20) + 4}, workgroups=(1, 1, 1),
                  constants={"ALPHA": float(k)})
        assert got["ys"] == np.float32(k).tobytes() and got["big"][:4] == (1).to_bytes(4, "little")
    again = run(port, "shift", {"ys": ys.tobytes()}, outputs={"big": 4}, workgroups=(1, 1, 1), constants={"ALPHA": 0.5})
    np.testing.assert_array_equal(np.frombuffer(again["ys"], np.float32), ys + 0.5)


def test_two_buffers_at_one_binding_bind_by_entry_point(port):
    """BEFORE (red team): bad_kernel in wgpu's words ("Validation Error ... In
    wgpuDeviceCreateBindGroupLayout ... Conflicting binding at index 0"), after admission.
    Each entry point binds only what its code reaches: `second` binds `b` alone and runs;
    `first` reaches no buffer and is bad_args, before any layout is made."""
    got = run(port, "two_entries", {"a": b"\0" * 4}, outputs={"b": 4}, workgroups=(1, 1, 1), entry_point=b"second")
    assert got == {"b": (7).to_bytes(4, "little")}
    with pytest.raises(PortError) as err:
        run(port, "two_entries", {"a": b"\0" * 4}, outputs={"b": 4}, workgroups=(1, 1, 1), entry_point=b"first")
    assert err.value.reason == "bad_args" and "uses no buffers" in err.value.detail, err.value
    assert "Validation Error" not in err.value.detail
