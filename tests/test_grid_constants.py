"""Explicit grids and pipeline-overridable constants (issue 25, items 2 and
3): a 2-D kernel run with ``grid`` (kem divides by the workgroup size,
rounding up), ``grid`` refused beside ``workgroups`` or past the device's
limit; ``constants`` become WebGPU pipeline constants, override-sized
workgroups resolve from them (or the override's default), missing and
unknown overrides are bad_args, and pipelines of two constant sets never
mix. Real port, real wgpu, values against numpy on fresh random inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import start_port
from kem_port.client import PortError
from kem_port.wire import terms
from test_cli import kem

# C[M, N] = A[M, K] x B[K, N]: A then B in the one input, (M, K, N) in the
# uniform; x is the column, y the row, 8x8 invocations a workgroup.
MATMUL = """
struct Dims { m: u32, k: u32, n: u32 }
@group(0) @binding(0) var<storage, read> ab: array<f32>;
@group(0) @binding(1) var<storage, read_write> c: array<f32>;
@group(0) @binding(2) var<uniform> dims: Dims;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row = gid.y;
    if (row >= dims.m || col >= dims.n) { return; }
    var sum = 0.0;
    let b0 = dims.m * dims.k;
    for (var i = 0u; i < dims.k; i = i + 1u) {
        sum = sum + ab[row * dims.k + i] * ab[b0 + i * dims.n + col];
    }
    c[row * dims.n + col] = sum;
}
"""

# An override-sized workgroup: each output element is (2 x input, the
# dispatch's workgroup count), so a test can see which size kem used.
SIZED = """
override WG: u32 = 64;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<vec2<f32>>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = vec2<f32>(a[i] * 2.0, f32(nwg.x));
}
"""

# An override in the arithmetic, with no default, and one with @id.
SCALED = """
override SCALE: f32;
@id(7) override BIAS: f32 = 0.5;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = a[i] * SCALE + BIAS;
}
"""


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("grid")
    for name, text in (("matmul", MATMUL), ("sized", SIZED), ("scaled", SCALED)):
        (kernels / f"{name}.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache")) as port:
        yield port


def refusal(port, *args) -> tuple[str, str]:
    with pytest.raises(PortError) as err:
        port.call(*args)
    return err.value.reason, err.value.detail


@pytest.mark.parametrize("m,k,n", [(8, 8, 8), (17, 5, 33), (48, 64, 3), (1, 9, 70)])
def test_a_matmul_runs_with_a_grid_of_its_output_shape(port, rng, m, k, n):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    dims = np.array([m, k, n, 0], np.uint32).tobytes()
    opts = {"params": dims, "grid": (n, m, 1), "output_size": m * n * 4}
    out = port.call("execute", b"matmul", a.tobytes() + b.tobytes(), opts)
    np.testing.assert_allclose(np.frombuffer(out, np.float32).reshape(m, n), a @ b, rtol=1e-4, atol=1e-4)


def test_grid_and_workgroups_together_are_refused(port):
    opts = {"params": bytes(16), "grid": (8, 8, 1), "workgroups": (1, 1, 1), "output_size": 256}
    reason, detail = refusal(port, "execute", b"matmul", bytes(512), opts)
    assert reason == "bad_args" and "grid" in detail and "workgroups" in detail


def test_a_grid_past_the_per_dimension_limit_is_refused(port):
    # 8 invocations a workgroup in x: 65535 * 8 + 1 invocations need 65536 groups.
    opts = {"params": bytes(16), "grid": (65535 * 8 + 1, 1, 1), "output_size": 256}
    reason, detail = refusal(port, "execute", b"matmul", bytes(512), opts)
    assert reason == "too_large" and "65536" in detail and "grid" in detail


def test_a_grid_that_is_not_three_positive_integers_is_refused(port):
    for bad in ((8, 8), (0, 1, 1), (1.5, 1, 1), "8,8,1"):
        reason, detail = refusal(port, "execute", b"sized", bytes(64), {"grid": bad})
        assert reason == "bad_args" and "grid" in detail


@pytest.mark.parametrize("count", [1, 63, 64, 65, 1000])
def test_an_override_sized_workgroup_uses_its_default_or_the_constant(port, rng, count):
    data = rng.standard_normal(count).astype(np.float32)
    plain = np.frombuffer(port.call("execute", b"sized", data.tobytes(), {"output_size_hint": 2}), np.float32).reshape(count, 2)
    np.testing.assert_array_equal(plain[:, 0], data * 2.0)
    assert set(plain[:, 1]) == {-(-count // 64)}  # WG = 64, its default
    opts = {"output_size_hint": 2, "constants": {"WG": 16}}
    small = np.frombuffer(port.call("execute", b"sized", data.tobytes(), opts), np.float32).reshape(count, 2)
    np.testing.assert_array_equal(small[:, 0], data * 2.0)
    assert set(small[:, 1]) == {-(-count // 16)}  # WG = 16: four times the workgroups


@pytest.mark.parametrize("count", [3, 64, 777])
def test_an_override_in_the_arithmetic_gives_numpys_values(port, rng, count):
    data = rng.standard_normal(count).astype(np.float32)
    scale = float(rng.uniform(-4, 4))
    out = port.call("execute", b"scaled", data.tobytes(), {"constants": {"SCALE": scale}})
    expect = data * np.float32(scale) + np.float32(0.5)
    np.testing.assert_allclose(np.frombuffer(out, np.float32), expect, rtol=1e-6, atol=1e-6)
    # BIAS by its name (kem passes @id(7)'s key), SCALE as a binary key, an integer value.
    out = port.call("execute", b"scaled", data.tobytes(), {"constants": {b"SCALE": 3, "BIAS": -1.25}})
    np.testing.assert_allclose(np.frombuffer(out, np.float32), data * 3 - 1.25, rtol=1e-6, atol=1e-6)


def test_pipelines_of_two_constant_sets_do_not_mix(port, rng):
    data = rng.standard_normal(500).astype(np.float32)
    for scale in (2.0, 3.0, 2.0, 3.0, -1.0, 2.0):
        out = port.call("execute", b"scaled", data.tobytes(), {"constants": {"SCALE": scale}})
        np.testing.assert_allclose(np.frombuffer(out, np.float32), data * np.float32(scale) + 0.5, rtol=1e-6, atol=1e-6)


def test_a_missing_override_without_a_default_is_bad_args(port):
    reason, detail = refusal(port, "execute_kernel", b"scaled", bytes(64), 1)
    assert reason == "bad_args" and "SCALE" in detail and "constants" in detail


def test_an_unknown_constant_is_bad_args(port):
    reason, detail = refusal(port, "execute", b"scaled", bytes(64), {"constants": {"SCALE": 1.0, "SCALF": 2.0}})
    assert reason == "bad_args" and "SCALF" in detail and "SCALE" in detail  # names it, lists the known


def test_a_constant_out_of_its_types_range_is_bad_args(port):
    for value in (-1, 2**32, 1.5):
        reason, detail = refusal(port, "execute", b"sized", bytes(64), {"constants": {"WG": value}})
        assert reason == "bad_args" and "WG" in detail and "u32" in detail
    reason, detail = refusal(port, "execute", b"scaled", bytes(64), {"constants": {"SCALE": 1e39}})
    assert reason == "bad_args" and "f32" in detail


def test_constants_that_are_not_a_map_of_numbers_are_refused(port):
    for bad in ([("SCALE", 1.0)], {"SCALE": b"1"}, {"SCALE": True}, {1: 2.0}):
        reason, detail = refusal(port, "execute", b"scaled", bytes(64), {"constants": bad})
        assert reason == "bad_args" and "constants" in detail


def test_a_workgroup_size_past_the_device_limit_is_refused_before_compiling(port):
    reason, detail = refusal(port, "execute", b"sized", bytes(64), {"constants": {"WG": 4096}})
    assert reason == "bad_args" and "4096" in detail


def test_a_chain_step_with_grid_and_workgroups_is_refused(port):
    # A step's grid is parsed (wire/session_protocol.py) and planned
    # (gpu/session/chain_plan.py); port/session_methods.py passes it on
    # once the lead adds it there (issue 25's report).
    step = {"kernel": b"matmul", "params": bytes(16), "grid": (8, 8, 1), "workgroups": (3, 2, 1), "output_size": 256}
    with pytest.raises(PortError) as err:
        port.chain([step], input=bytes(512))
    assert err.value.reason == "bad_args" and "grid" in err.value.detail and "workgroups" in err.value.detail


def test_the_cli_runs_with_grid_and_constants_and_check_names_the_grid_rule(tmp_path, rng):
    (tmp_path / "matmul.wgsl").write_text(MATMUL)
    (tmp_path / "scaled.wgsl").write_text(SCALED)
    m, k, n = 9, 4, 11
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    (tmp_path / "in.bin").write_bytes(a.tobytes() + b.tobytes())
    ran = kem(tmp_path, "run", str(tmp_path / "matmul.wgsl"), "--input", str(tmp_path / "in.bin"),
              "--params", f"{m},{k},{n},0", "--grid", f"{n},{m},1", "--output-size", str(m * n * 4),
              "--output", str(tmp_path / "out.bin"))
    assert ran.returncode == 0, ran.stderr
    got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(m, n)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    checked = kem(tmp_path, "check", str(tmp_path / "matmul.wgsl"), "--params", f"{m},{k},{n},0",
                  "--grid", f"{n},{m},1", "--json")
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["dispatch_rule"] == "grid" and report["dispatch"] == [2, 2, 1]  # 11/8, 9/8 rounded up
    data = rng.standard_normal(100).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(data.tobytes())
    scaled = kem(tmp_path, "run", str(tmp_path / "scaled.wgsl"), "--input", str(tmp_path / "x.bin"),
                 "--constant", "SCALE=1.5", "--constant", "BIAS=2", "--output", str(tmp_path / "y.bin"))
    assert scaled.returncode == 0, scaled.stderr
    np.testing.assert_allclose(np.frombuffer((tmp_path / "y.bin").read_bytes(), np.float32), data * 1.5 + 2, rtol=1e-6, atol=1e-6)
    missing = kem(tmp_path, "run", str(tmp_path / "scaled.wgsl"), "--input", str(tmp_path / "x.bin"))
    assert missing.returncode != 0 and b"SCALE" in missing.stderr


def test_the_slot_form_refuses_a_kernel_with_overrides():
    """The slot form is compiled without a call's constants: such a kernel keeps one dispatch a slot."""
    from kem_port.gpu.group.slot_kernel import Refused, rewrite

    plain = SIZED.replace("override WG: u32 = 64;", "").replace("@workgroup_size(WG)", "@workgroup_size(64)")
    plain = plain.replace("array<vec2<f32>>", "array<f32>").replace("vec2<f32>(a[i] * 2.0, f32(nwg.x))", "a[i] * 2.0")
    assert rewrite(plain, "main").source  # the same kernel without its override runs as slots
    with pytest.raises(Refused, match="integer literals"):  # override-sized
        rewrite(SIZED.replace("array<vec2<f32>>", "array<f32>").replace("vec2<f32>(a[i] * 2.0, f32(nwg.x))", "a[i] * 2.0"), "main")
    with pytest.raises(Refused, match="override"):
        rewrite(SCALED.replace("override SCALE: f32;", "override SCALE: f32 = 1.0;"), "main")


def test_a_grid_call_never_runs_on_the_reader(port, rng):
    """BEFORE (red team): a grid call passed lone_call.plain() and ran on the reader,
    which a caller-sized dispatch could hold; it queues to the GPU thread, as workgroups do."""
    def stat(name: str) -> int:
        return port.call("stats").get(terms.atom(name), 0)

    data = rng.integers(0, 256, 256, dtype=np.uint8).tobytes()
    port.call("execute", b"double", data, {"grid": (64, 1, 1)})  # compiled and warm
    before = stat("inline_calls")
    for _ in range(3):
        got = port.call("execute", b"double", data, {"grid": (64, 1, 1)})
        assert got == np.frombuffer(data, np.uint32).astype(np.uint64).__mul__(2).astype(np.uint32).tobytes()
    assert stat("inline_calls") == before


@pytest.mark.parametrize("words, grid", [(64, 64), (1000, 300), (513, 513)])
def test_a_chain_steps_grid_sizes_its_dispatch(port, rng, words, grid):
    """BEFORE: a step's grid was parsed and then dropped (session_methods built its Step without it):
    the default rule ran every word. With grid G only the first G words (rounded up to the
    workgroup of 256) are doubled; the rest stay zero."""
    data = rng.integers(0, 2**31, words, dtype=np.uint32)
    got = np.frombuffer(port.call("chain", None, [{"kernel": b"double", "grid": (grid, 1, 1)}], {"input": data.tobytes()}), np.uint32)
    covered = min(words, -(-grid // 256) * 256)
    np.testing.assert_array_equal(got[:covered], data[:covered] * np.uint32(2))
    assert not got[covered:].any()
