"""``kem check`` shows a kernel's overrides (issue 25): each with its type,
@id and default, which ones every call must give, and the stand-in value the
check compiled a required one with; a call without a required override is
refused naming it, through the CLI as through the port."""

from __future__ import annotations

import json

import numpy as np

from cli_helpers import kem

TEMPLATE = """
override SCALE: f32;
@id(7) override BIAS: f32 = 0.5;
override WG: u32 = 64;
override HALF: u32 = WG / 2u;
var<workgroup> t: array<f32, WG>;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gid.x;
    t[li] = a[min(i, arrayLength(&a) - 1u)];
    workgroupBarrier();
    if (i >= arrayLength(&b)) { return; }
    b[i] = t[li] * SCALE + BIAS + f32(HALF - HALF);
}
"""


def check(tmp_path, *extra: str):
    path = tmp_path / "template.wgsl"
    path.write_text(TEMPLATE)
    done = kem(tmp_path, "check", str(path), *extra)
    return done


def test_kem_check_lists_overrides_with_their_defaults_and_the_required_ones(tmp_path):
    done = check(tmp_path, "--json")
    report = json.loads(done.stdout)
    named = report["named"]
    assert [(o["name"], o["type"], o["id"], o["default"], o["required"]) for o in named["overrides"]] == [
        ("SCALE", "f32", None, None, True), ("BIAS", "f32", 7, 0.5, False), ("WG", "u32", None, 64, False),
        ("HALF", "u32", None, "an expression", False)]
    assert named["supply"]["constants"] == ["SCALE: f32 (no default)"]
    # the named road is checked with a stand-in for SCALE, and says so
    assert named["ok"] is True and named["compiled_with"] == {"SCALE": 1}, named["problems"]
    # the kem@1.0 road names the missing override
    assert report["ok"] is False and report["reason"] == "bad_args" and "SCALE" in report["error"], report


def test_kem_check_with_the_constant_given_needs_no_stand_in(tmp_path):
    report = json.loads(check(tmp_path, "--json", "--constant", "SCALE=2.5", "--constant", "WG=32").stdout)
    named = report["named"]
    assert named["supply"]["constants"] == [] and named["compiled_with"] == {} and named["ok"] is True
    assert {o["name"]: o["given"] for o in named["overrides"]} == {"SCALE": 2.5, "BIAS": None, "WG": 32, "HALF": None}
    assert report["ok"] is True, report


def test_kem_check_prints_each_override(tmp_path):
    done = check(tmp_path)
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("override")]
    assert lines == ["override  SCALE: f32, no default: every call must give it; checked with SCALE = 1",
                     "override  BIAS: f32 @id(7), default 0.5",
                     "override  WG: u32, default 64",
                     "override  HALF: u32, default an expression"], done.stdout
    assert "named     constants: SCALE: f32 (no default)" in done.stdout.decode()


def test_a_run_without_the_required_override_is_refused_naming_it(tmp_path, rng):
    (tmp_path / "template.wgsl").write_text(TEMPLATE)
    data = rng.standard_normal(100).astype(np.float32)
    (tmp_path / "a.bin").write_bytes(data.tobytes())
    refused = kem(tmp_path, "run", str(tmp_path / "template.wgsl"), "--input", str(tmp_path / "a.bin"))
    assert refused.returncode != 0 and "SCALE" in refused.stderr.decode() and "no default" in refused.stderr.decode(), refused.stderr
    done = kem(tmp_path, "run", str(tmp_path / "template.wgsl"), "--input", str(tmp_path / "a.bin"),
               "--constant", "SCALE=2", "-o", str(tmp_path / "b.bin"))
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.frombuffer((tmp_path / "b.bin").read_bytes(), np.float32), data * 2 + np.float32(0.5))
