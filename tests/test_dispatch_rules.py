"""kem never computes with a guessed dispatch (issue 25): each kernel shape
that got a default rule which could not be right, and so a silently wrong
result, is now refused with a bad_args naming the rules, and right with an
explicit dispatch; the 1-D rule counts the output's own elements; `kem
check` names the rule. Real port, real wgpu, values against numpy on
fresh random inputs of several sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import start_port
from kem_port.client import PortError
from test_cli import kem

# A 16x16 tiled transpose in the style of the WebGPU samples: x is the
# column, y the row; the shape is fixed by the host (here 48 x 64).
TRANSPOSE = """
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
const ROWS: u32 = 48u;
const COLS: u32 = 64u;
@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row = gid.y;
    if (row >= ROWS || col >= COLS) { return; }
    dst[col * ROWS + row] = src[row * COLS + col];
}
"""

# A GELU over a rows x cols matrix whose params are (rows, cols): not an
# image's (width, height), so the image rule crossed its axes.
GELU = """
struct Shape { rows: u32, cols: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> shape: Shape;
@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let row = gid.y;
    if (row >= shape.rows || col >= shape.cols) { return; }
    let i = row * shape.cols + col;
    let v = x[i];
    y[i] = 0.5 * v * (1.0 + tanh(0.7978845608 * (v + 0.044715 * v * v * v)));
}
"""

# One vec4 an invocation: the 1-D rule counts 16-byte elements.
SCALE4 = """
@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = a[i] * 3.0;
}
"""

# A struct element array (16-byte elements: vec3 then f32).
PARTICLES = """
struct Particle { pos: vec3<f32>, mass: f32 }
@group(0) @binding(0) var<storage, read> inp: array<Particle>;
@group(0) @binding(1) var<storage, read_write> out: array<Particle>;
@compute @workgroup_size(32)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&out)) { return; }
    out[i] = Particle(inp[i].pos + vec3<f32>(1.0, 2.0, 3.0), inp[i].mass * 2.0);
}
"""

ROWS, COLS = 48, 64


def gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + np.tanh(0.7978845608 * (v + 0.044715 * v**3)))


@pytest.fixture(scope="module")
def rules_port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("rules")
    for name, text in (("transpose", TRANSPOSE), ("gelu", GELU), ("scale4", SCALE4), ("particles", PARTICLES)):
        (kernels / f"{name}.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache")) as port:
        yield port


def refusal(port, *args) -> tuple[str, str]:
    with pytest.raises(PortError) as err:
        port.call(*args)
    return err.value.reason, err.value.detail


def test_a_2d_kernel_gets_no_1d_guess(rules_port, rng):
    """BEFORE: the 1-D default ran the 16x16 transpose and computed 768 of 3,072 outputs, no error."""
    data = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    reason, detail = refusal(rules_port, "execute_kernel", b"transpose", data.tobytes(), 1)
    assert reason == "bad_args" and "@workgroup_size(16, 16, 1)" in detail and "workgroups" in detail
    out = rules_port.call("execute", b"transpose", data.tobytes(), {"workgroups": (COLS // 16, ROWS // 16, 1)})
    np.testing.assert_array_equal(np.frombuffer(out, np.float32).reshape(COLS, ROWS), data.T)


def test_params_that_are_not_width_and_height_get_no_image_guess(rules_port, rng):
    """BEFORE: the image rule read (rows, cols) as (width, height) and left 768 of 3,072 outputs unwritten."""
    for rows, cols in ((48, 64), (17, 33), (5, 200)):
        data = rng.standard_normal(rows * cols).astype(np.float32)
        params = np.array([rows, cols], np.uint32).tobytes()
        reason, detail = refusal(rules_port, "execute_kernel_with_params", b"gelu", data.tobytes(), params)
        assert reason == "bad_args" and "width, height" in detail
        groups = (-(-cols // 16), -(-rows // 16), 1)
        out = rules_port.call("execute", b"gelu", data.tobytes(), {"params": params, "workgroups": groups})
        np.testing.assert_allclose(np.frombuffer(out, np.float32), gelu(data.astype(np.float64)), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("count", [1, 63, 64, 1000, 4097])
def test_the_1d_rule_counts_vec4_elements(rules_port, rng, count):
    data = rng.standard_normal(4 * count).astype(np.float32)
    out = rules_port.call("execute_kernel", b"scale4", data.tobytes(), 1)
    np.testing.assert_allclose(np.frombuffer(out, np.float32), data * 3.0, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("count", [1, 31, 32, 500])
def test_the_1d_rule_counts_struct_elements(rules_port, rng, count):
    data = rng.standard_normal((count, 4)).astype(np.float32)
    out = np.frombuffer(rules_port.call("execute_kernel", b"particles", data.tobytes(), 1), np.float32).reshape(count, 4)
    np.testing.assert_allclose(out[:, :3], data[:, :3] + [1.0, 2.0, 3.0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[:, 3], data[:, 3] * 2.0, rtol=1e-6, atol=1e-6)


def test_the_image_rule_still_runs_kem_at_1_0s_pixelize(rules_port, rng):
    """pixelize's params begin (width, height): the image rule fits it, unchanged."""
    width, height = 37, 21
    image = rng.integers(0, 2**32, width * height, dtype=np.uint32)
    params = np.array([width, height, 1, 0], np.uint32).tobytes()  # a 1-pixel block: the image itself
    out = rules_port.call("execute_kernel_with_params", b"pixelize", image.tobytes(), params)
    np.testing.assert_array_equal(np.frombuffer(out, np.uint32), image)


def test_kem_check_names_the_rule(tmp_path):
    (tmp_path / "transpose.wgsl").write_text(TRANSPOSE)
    (tmp_path / "scale4.wgsl").write_text(SCALE4)
    one_d = kem(tmp_path, "check", str(tmp_path / "scale4.wgsl"), "--input-size", "1600", "--json")
    assert one_d.returncode == 0, one_d.stderr
    report = json.loads(one_d.stdout)
    assert report["dispatch_rule"] == "1-D" and report["dispatch"] == [2, 1, 1]  # 100 vec4s, 64 a group
    refused = kem(tmp_path, "check", str(tmp_path / "transpose.wgsl"), "--json")
    report = json.loads(refused.stdout)
    # No default rule fits: refused as a kem@1.0 call; it runs with an explicit dispatch
    # (by named buffers too), which is what check says, with exit 0.
    assert report["ok"] is False and report["named"]["ok"] is True and refused.returncode == 0
    assert report["dispatch_rule"] == "none: workgroups required" and report["reason"] == "bad_args"
    explicit = kem(tmp_path, "check", str(tmp_path / "transpose.wgsl"), "--workgroups", "4,3,1", "--json")
    assert explicit.returncode == 0, explicit.stderr
    assert json.loads(explicit.stdout)["dispatch_rule"] == "workgroups"


def test_a_missing_entry_point_lists_only_compute_entry_points(tmp_path):
    """BEFORE (issue 26): the "found" list named plain functions too (helper functions are not entry points)."""
    source = "@group(0) @binding(0) var<storage, read> a: array<u32>;\n" \
             "@group(0) @binding(1) var<storage, read_write> b: array<u32>;\n" \
             "fn helper(i: u32) -> u32 { return a[i]; }\n" \
             "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { b[g.x] = helper(g.x); }\n"
    (tmp_path / "k.wgsl").write_text(source)
    done = kem(tmp_path, "run", str(tmp_path / "k.wgsl"), "--hex", "00000000", "--entry-point", "nope")
    said = done.stderr.decode()
    assert done.returncode == 1 and "no @compute entry point 'nope' (found main)" in said, said
