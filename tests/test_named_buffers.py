"""Any kernel as its author wrote it (issue 25): buffers bound by WGSL name
at any group and binding, several inputs and outputs, in/out buffers,
uniforms anywhere; through the real port, values against numpy on fresh
random inputs of several sizes; and every call kem cannot bind is a
bad_args naming the buffer."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import kernels_port
from kem_port.client import PortError
from kem_port.wire import terms

KERNELS = {
    # wgpu's examples: two inputs, the output at binding 2.
    "add": """
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&c)) { c[i] = a[i] + b[i]; }
}
""",
    # A naive matmul with its shape in a uniform at a high binding.
    "matmul": """
struct Dims { m: u32, n: u32, k: u32 }
@group(0) @binding(0) var<storage, read> lhs: array<f32>;
@group(0) @binding(1) var<storage, read> rhs: array<f32>;
@group(0) @binding(2) var<storage, read_write> product: array<f32>;
@group(0) @binding(5) var<uniform> dims: Dims;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    if (row >= dims.m || col >= dims.n) { return; }
    var sum = 0.0;
    for (var i = 0u; i < dims.k; i++) { sum += lhs[row * dims.k + i] * rhs[i * dims.n + col]; }
    product[row * dims.n + col] = sum;
}
""",
    # In place: a read_write buffer given bytes and returned changed; the uniform at binding 0.
    "axpy": """
struct Params { alpha: f32, count: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < params.count) { y[i] = params.alpha * x[i] + y[i]; }
}
""",
    # Several outputs, the outputs in a second bind group.
    "sumdiff": """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(1) @binding(0) var<storage, read_write> total: array<u32>;
@group(1) @binding(3) var<storage, read_write> delta: array<u32>;
@compute @workgroup_size(32)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&total)) {
        total[i] = a[i] + b[i];
        delta[i] = a[i] - b[i];
    }
}
""",
    # Host-template style: an override-sized workgroup and an override used in the arithmetic.
    "saxpy_tmpl": """
override WG: u32 = 64;
override ALPHA: f32;
@group(0) @binding(0) var<storage, read> xs: array<f32>;
@group(0) @binding(1) var<storage, read_write> ys: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&ys)) { ys[i] = ALPHA * xs[i] + ys[i]; }
}
""",
    # Two kernels in one file, each with its own buffers (a library module).
    "twokernels": """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> doubled: array<u32>;
@group(0) @binding(2) var<storage, read_write> counts: array<atomic<u32>>;
fn twice(i: u32) -> u32 { return src[i] * 2u; }
@compute @workgroup_size(64)
fn double_all(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&doubled)) { doubled[gid.x] = twice(gid.x); }
}
@compute @workgroup_size(64)
fn count_odd(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&src) && (src[gid.x] & 1u) == 1u) { atomicAdd(&counts[0], 1u); }
}
""",
    "sampled": """
@group(0) @binding(0) var tex: texture_2d<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main() { out[0] = textureLoad(tex, vec2<i32>(0, 0), 0).x; }
""",
}


@pytest.fixture(scope="module")
def named_port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("named"), KERNELS) as port:
        yield port


def run(port, kernel: str, buffers: dict, **opts) -> dict[str, bytes]:
    """The port's run method; its map of returned buffers as {name: bytes}."""
    named = {k.encode() if isinstance(k, str) else k: v for k, v in buffers.items()}  # binaries, as the node sends names
    if "outputs" in opts:
        opts["outputs"] = {k.encode(): v for k, v in opts["outputs"].items()}
    got = port.call("run", kernel.encode(), named, opts)
    return {terms.binary_bytes(k).decode(): terms.binary_bytes(v) for k, v in got.items()}


def groups_for(n: int, size: int) -> tuple[int, int, int]:
    return (-(-n // size), 1, 1)


@pytest.mark.parametrize("n", [1, 63, 64, 1000, 4099])
def test_two_inputs_and_an_output_at_binding_2(named_port, rng, n):
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    got = run(named_port, "add", {"a": a.tobytes(), "b": b.tobytes()}, outputs={"c": 4 * n}, workgroups=groups_for(n, 64))
    assert list(got) == ["c"]
    np.testing.assert_array_equal(np.frombuffer(got["c"], np.float32), a + b)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 9, 5), (16, 16, 16), (33, 20, 47)])
def test_matmul_with_its_shape_in_a_uniform_at_binding_5(named_port, rng, m, n, k):
    lhs, rhs = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    dims = np.array([m, n, k], np.uint32).tobytes()
    got = run(named_port, "matmul", {"lhs": lhs.tobytes(), "rhs": rhs.tobytes(), "dims": dims},
              outputs={"product": 4 * m * n}, workgroups=(-(-n // 8), -(-m // 8), 1))
    np.testing.assert_allclose(np.frombuffer(got["product"], np.float32).reshape(m, n), lhs @ rhs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 100, 2048])
def test_an_in_place_buffer_comes_back_changed_and_the_uniform_sits_at_binding_0(named_port, rng, n):
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    params = np.array([2.5], np.float32).tobytes() + np.array([n], np.uint32).tobytes()
    got = run(named_port, "axpy", {"params": params, "x": x.tobytes(), "y": y.tobytes()}, workgroups=groups_for(n, 64))
    assert list(got) == ["y"]
    np.testing.assert_allclose(np.frombuffer(got["y"], np.float32), np.float32(2.5) * x + y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [5, 96, 1001])
def test_several_outputs_in_a_second_bind_group_by_name_and_by_number(named_port, rng, n):
    a = rng.integers(0, 2**31, n, dtype=np.uint32)
    b = rng.integers(0, 2**31, n, dtype=np.uint32)
    got = run(named_port, "sumdiff", {"0/0": a.tobytes(), "b": b.tobytes()}, outputs={"total": 4 * n, "1/3": 4 * n},
              workgroups=groups_for(n, 32))
    assert sorted(got) == ["delta", "total"]
    np.testing.assert_array_equal(np.frombuffer(got["total"], np.uint32), a + b)
    np.testing.assert_array_equal(np.frombuffer(got["delta"], np.uint32), a - b)


def test_calls_of_two_kernels_and_sizes_alternate_without_mixing(named_port, rng):
    for n in (3, 700, 3, 700):
        a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        got = run(named_port, "add", {"a": a.tobytes(), "b": b.tobytes()}, outputs={"c": 4 * n}, workgroups=groups_for(n, 64))
        np.testing.assert_array_equal(np.frombuffer(got["c"], np.float32), a + b)
        u = rng.integers(0, 2**31, n, dtype=np.uint32)
        got = run(named_port, "sumdiff", {"a": u.tobytes(), "b": u.tobytes()}, outputs={"total": 4 * n, "delta": 4 * n},
                  workgroups=groups_for(n, 32))
        assert got["delta"] == bytes(4 * n) and np.array_equal(np.frombuffer(got["total"], np.uint32), 2 * u)


@pytest.mark.parametrize("buffers, opts, words", [
    ({"a": b"\0" * 16, "b": b"\0" * 16}, {"workgroups": (1, 1, 1)}, ("output 'c'", "needs a size")),
    ({"a": b"\0" * 16}, {"outputs": {"c": 16}, "workgroups": (1, 1, 1)}, ("input 'b'", "not given")),
    ({"a": b"\0" * 16, "b": b"\0" * 16, "z": b"\0"}, {"outputs": {"c": 16}, "workgroups": (1, 1, 1)}, ("no binding named 'z'", "a, b, c")),
    ({"a": b"\0" * 16, "b": b"\0" * 16}, {"outputs": {"c": 16}}, ("workgroups", "kem@1.0")),
    ({"a": b"\0" * 16, "0/0": b"\0" * 16, "b": b"\0" * 16}, {"outputs": {"c": 16}, "workgroups": (1, 1, 1)}, ("given twice",)),
    ({"a": b"\0" * 16, "b": b"\0" * 16}, {"outputs": {"a": 16, "c": 16}, "workgroups": (1, 1, 1)}, ("'a'", "an input")),
])
def test_what_kem_cannot_bind_is_bad_args_naming_the_buffer(named_port, buffers, opts, words):
    if "outputs" in opts:
        opts = {**opts, "outputs": {k.encode(): v for k, v in opts["outputs"].items()}}
    with pytest.raises(PortError) as err:
        named_port.call("run", b"add", {k.encode(): v for k, v in buffers.items()}, opts)
    assert err.value.reason == "bad_args", err.value
    assert all(w in err.value.detail for w in words), err.value.detail


def test_a_short_uniform_a_texture_and_oversized_outputs_are_refused(named_port):
    short = {"params": b"\0" * 4, "x": b"\0" * 4, "y": b"\0" * 4}
    with pytest.raises(PortError) as err:
        run(named_port, "axpy", short, workgroups=(1, 1, 1))
    assert err.value.reason == "bad_args" and "uniform 'params' is 8 bytes; 4 given" in err.value.detail
    with pytest.raises(PortError) as err:
        run(named_port, "sampled", {}, outputs={"out": 4}, workgroups=(1, 1, 1))
    assert err.value.reason == "bad_kernel" and "tex" in err.value.detail and "not a buffer" in err.value.detail
    with pytest.raises(PortError) as err:
        run(named_port, "add", {"a": b"", "b": b""}, outputs={"c": 1 << 40}, workgroups=(1, 1, 1))
    assert err.value.reason == "too_large"


def test_a_callers_dispatch_is_bounded_by_work_not_per_dimension(named_port):
    """BEFORE (red team): workgroups {4096, 256, 1} for 16 bytes ran, 0.5 s on the reader, and
    {65535, 65535, 1} would have held the port ~2,000 s; each dimension alone was within the limit."""
    four = {"a": b"\0" * 16, "b": b"\0" * 16}
    with pytest.raises(PortError) as err:
        run(named_port, "add", four, outputs={"c": 16}, workgroups=(65535, 65535, 1))
    assert err.value.reason == "bad_args" and "workgroups" in err.value.detail
    assert named_port.call("ping") == terms.atom("pong")


@pytest.mark.parametrize("n, wg", [(1, 64), (1000, 64), (1000, 32), (4097, 256)])
def test_a_host_template_runs_with_a_grid_and_its_constants(named_port, rng, n, wg):
    xs, ys = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    got = run(named_port, "saxpy_tmpl", {"xs": xs.tobytes(), "ys": ys.tobytes()}, grid=(n, 1, 1),
              constants={"WG": wg, "ALPHA": 1.5})
    np.testing.assert_allclose(np.frombuffer(got["ys"], np.float32), np.float32(1.5) * xs + ys, rtol=1e-6, atol=1e-6)


def test_a_template_without_its_constant_or_with_two_dispatches_is_refused(named_port):
    four = {"xs": b"\0" * 16, "ys": b"\0" * 16}
    with pytest.raises(PortError) as err:
        run(named_port, "saxpy_tmpl", four, grid=(4, 1, 1))
    assert err.value.reason == "bad_args" and "ALPHA" in err.value.detail
    with pytest.raises(PortError) as err:
        run(named_port, "saxpy_tmpl", four, grid=(4, 1, 1), workgroups=(1, 1, 1), constants={"ALPHA": 1.0})
    assert err.value.reason == "bad_args" and "grid" in err.value.detail


def test_the_cli_runs_a_kernel_by_named_buffers(tmp_path, rng):
    """kem run --buffer/--out: two inputs from a file and random bytes, outputs written by name."""
    from test_cli import kem

    (tmp_path / "sumdiff.wgsl").write_text(KERNELS["sumdiff"])
    n = 300
    a = rng.integers(0, 2**31, n, dtype=np.uint32)
    b = rng.integers(0, 2**31, n, dtype=np.uint32)
    (tmp_path / "a.bin").write_bytes(a.tobytes())
    (tmp_path / "b.bin").write_bytes(b.tobytes())
    done = kem(tmp_path, "run", str(tmp_path / "sumdiff.wgsl"), "--buffer", f"a=@{tmp_path / 'a.bin'}",
               "--buffer", f"b=@{tmp_path / 'b.bin'}", "--out", f"total={4 * n}", "--out", f"1/3={4 * n}",
               "--grid", str(n), "--out-dir", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.fromfile(tmp_path / "out" / "total.bin", np.uint32), a + b)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "out" / "delta.bin", np.uint32), a - b)
    missing = kem(tmp_path, "run", str(tmp_path / "sumdiff.wgsl"), "--buffer", "a=random:16", "--buffer", "b=hex:00000000",
                  "--out", "total=16", "--grid", "4")
    assert missing.returncode == 1 and "bad_args" in missing.stderr.decode() and "delta" in missing.stderr.decode()


def test_kem_check_says_what_a_call_by_named_buffers_must_supply(tmp_path):
    """BEFORE: `kem check` called such a kernel invalid (binding 1 must be the output) and stopped there."""
    from test_cli import kem

    (tmp_path / "matmul.wgsl").write_text(KERNELS["matmul"])
    (tmp_path / "sampled.wgsl").write_text(KERNELS["sampled"])
    done = kem(tmp_path, "check", str(tmp_path / "matmul.wgsl"), "--json")
    assert done.returncode == 0, done.stderr
    report = __import__("json").loads(done.stdout)
    assert report["ok"] is False and report["named"]["ok"] is True
    assert [(b["name"], b["role"]) for b in report["bindings"]] == [("lhs", "input"), ("rhs", "input"), ("product", "output"), ("dims", "uniform")]
    supply = report["named"]["supply"]
    assert [s.split(" ")[0] for s in supply["inputs"]] == ["lhs", "rhs"] and supply["uniforms"] == ["dims (@group(0) @binding(5)): 12 bytes"]
    assert supply["outputs"][0].startswith("product") and "grid" in report["named"]["dispatch_rule"]
    refused = kem(tmp_path, "check", str(tmp_path / "sampled.wgsl"), "--json")
    report = __import__("json").loads(refused.stdout)
    assert refused.returncode == 1 and report["named"]["ok"] is False
    assert any("tex" in p and "not a buffer" in p for p in report["named"]["problems"])


def test_a_small_run_runs_on_the_reader_and_a_large_one_does_not(named_port, rng):
    """A run as short as a lone kem@1.0 call (at most 16,384 invocations, 64 KiB, a kernel that cannot
    loop) runs inline, as that call does; a dispatch over the bound queues to the GPU thread."""
    def inline() -> int:
        return named_port.call("stats").get(terms.atom("inline_named_calls"), 0)

    a = rng.standard_normal(64).astype(np.float32)
    small = {"a": a.tobytes(), "b": a.tobytes()}
    run(named_port, "add", small, outputs={"c": 256}, workgroups=(1, 1, 1))  # admitted, compiled, its kit built
    before = inline()
    got = run(named_port, "add", small, outputs={"c": 256}, workgroups=(1, 1, 1))
    np.testing.assert_array_equal(np.frombuffer(got["c"], np.float32), a + a)
    assert inline() == before + 1
    got = run(named_port, "add", small, outputs={"c": 256}, workgroups=(257, 1, 1))  # 16,448 invocations
    np.testing.assert_array_equal(np.frombuffer(got["c"], np.float32), a + a)
    assert inline() == before + 1


@pytest.mark.parametrize("n", [1, 100, 1000])
def test_each_entry_point_binds_only_the_buffers_it_uses(named_port, rng, n):
    """BEFORE (red team): kem bound every buffer the module declares, so entry `count_odd` needed
    an output size for `doubled`, which it never touches. Now each entry point binds what its code reaches
    (through the functions it calls); a buffer given for another entry point's binding is not bound."""
    src = rng.integers(0, 2**31, n, dtype=np.uint32)
    got = run(named_port, "twokernels", {"src": src.tobytes()}, outputs={"doubled": 4 * n},
              grid=(n, 1, 1), entry_point="double_all")
    assert list(got) == ["doubled"]
    np.testing.assert_array_equal(np.frombuffer(got["doubled"], np.uint32), src * np.uint32(2))
    got = run(named_port, "twokernels", {"src": src.tobytes(), "counts": bytes(4)}, outputs={"doubled": 4 * n},
              grid=(n, 1, 1), entry_point="count_odd")
    assert list(got) == ["counts"]
    assert int(np.frombuffer(got["counts"], np.uint32)[0]) == int((src & 1).sum())


def test_used_names_follow_the_functions_an_entry_point_calls():
    """The spec lexer's tokens (not tree-sitter): a module-scope const and a bare barrier
    statement, which tree-sitter's grammar fails on, do not hide a use."""
    from kem_port.gpu.wgsl.wgsl_calls import used_names

    text = KERNELS["twokernels"] + "\nconst K: u32 = 3u;\nfn far() -> u32 { return counts_alias(); }\n"
    assert {"src", "doubled", "twice"} <= used_names(text, "double_all")
    assert "counts" not in used_names(text, "double_all")
    assert {"src", "counts"} <= used_names(text, "count_odd") and "doubled" not in used_names(text, "count_odd")
    assert used_names(text, "no_such_entry") is None
    barrier = "var<workgroup> w: u32;\n@group(0) @binding(0) var<storage, read_write> o: array<u32>;\n" \
              "@compute @workgroup_size(1) fn main() { workgroupBarrier(); o[0] = w; }\n"
    assert {"o", "w"} <= used_names(barrier, "main")
