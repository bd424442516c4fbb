"""Red team of ``grid`` and ``constants`` on ``execute`` (issue 28): what
held when the options were pushed at their edges through the real port.
Each test states the input and the answer kem gave."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import start_port
from kem_port.client import PortError

# The override's bits in every output word: a test sees which value the
# pipeline was built with, -0.0 (0x80000000) apart from 0.0.
SIGN = """
override S: f32 = 1.0;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = bitcast<u32>(S);
}
"""

# An override-sized workgroup array: each invocation writes and reads its slot.
WGARR = """
override N: u32 = 64;
var<workgroup> t: array<f32, N>;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gid.x;
    t[N - 1u - li] = a[i];
    workgroupBarrier();
    if (i >= arrayLength(&b)) { return; }
    b[i] = t[N - 1u - li] * 2.0;
}
"""

SIZED = """
override WG: u32 = 64;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = a[i] + 1.0;
}
"""

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

KERNELS = {"sign": SIGN, "wgarr": WGARR, "sized": SIZED, "scaled": SCALED}


def _port(tmp_path):
    for name, text in KERNELS.items():
        (tmp_path / f"{name}.wgsl").write_text(text)
    return start_port(KEM_KERNEL_DIR=str(tmp_path), KEM_CACHE_DIR=str(tmp_path / "cache"))


@pytest.fixture
def port(tmp_path):
    with _port(tmp_path) as port:
        yield port


def refusal(port, *args) -> tuple[str, str]:
    with pytest.raises(PortError) as err:
        port.call(*args)
    return err.value.reason, err.value.detail


def words(out: bytes) -> set[int]:
    return set(np.frombuffer(out, np.uint32).tolist())


DATA = np.arange(8, dtype=np.float32)


@pytest.mark.parametrize("value,reason", [(10**400, "too_large"), (2**64, "too_large"), (True, "bad_args")])
def test_huge_integers_and_booleans_are_refused_as_constants(port, value, reason):
    got, detail = refusal(port, "execute", b"sign", DATA.tobytes(), {"constants": {"S": value}})
    assert got == reason, detail
    # the port still serves the next call
    assert words(port.call("execute", b"sign", DATA.tobytes(), {"constants": {"S": 1.0}})) == {0x3F800000}


def test_an_override_by_name_and_by_id_digits_in_one_call_is_refused(port):
    # BIAS is @id(7): both spellings in one map. kem kept one of them (the
    # same in the check and the pipeline), so the caller's other value went
    # unread with no word; now bad_args, whichever order the map lists
    # (red team of the named calls, tests/test_red_team_run3.py).
    for opts in ({"SCALE": 1.0, "BIAS": 2.0, "7": 5.0}, {"SCALE": 1.0, "7": 5.0, "BIAS": 2.0}):
        reason, detail = refusal(port, "execute", b"scaled", DATA.tobytes(), {"constants": opts})
        assert reason == "bad_args" and "BIAS given twice" in detail, detail


def test_a_by_id_spelling_and_a_by_name_spelling_give_the_same_values(port):
    by_name = port.call("execute", b"scaled", DATA.tobytes(), {"constants": {"SCALE": 2, "BIAS": -1.0}})
    by_id = port.call("execute", b"scaled", DATA.tobytes(), {"constants": {"SCALE": 2, "7": -1.0}})
    assert by_name == by_id
    np.testing.assert_array_equal(np.frombuffer(by_id, np.float32), DATA * 2 - 1)


@pytest.mark.parametrize("wg", [0, 2**32 - 1])
def test_an_override_workgroup_size_of_zero_or_the_u32_top_is_refused(port, wg):
    reason, _ = refusal(port, "execute", b"sized", DATA.tobytes(), {"constants": {"WG": wg}})
    assert reason in ("bad_kernel", "bad_args")
    out = port.call("execute", b"sized", DATA.tobytes(), {"constants": {"WG": 8}})
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), DATA + 1)


@pytest.mark.parametrize("grid,reason", [((2**64, 1, 1), "too_large"), ((2**64 - 1, 1, 1), "too_large"),
                                         ((2**40, 1, 1), "too_large"), ((1, 1, -1), "bad_args")])
def test_a_grid_past_the_limits_is_refused_with_an_override_sized_workgroup(port, grid, reason):
    got, detail = refusal(port, "execute", b"sized", DATA.tobytes(), {"constants": {"WG": 1024}, "grid": grid})
    assert got == reason, detail



def test_negative_zero_gets_a_pipeline_of_its_own(port):
    """BEFORE: 0.0 == -0.0 and hash alike in Python, so the cache keyed on the
    values handed -0.0's call the pipeline built for 0.0 (bitcast said 0)."""
    assert words(port.call("execute", b"sign", DATA.tobytes(), {"constants": {"S": 0.0}})) == {0}
    assert words(port.call("execute", b"sign", DATA.tobytes(), {"constants": {"S": -0.0}})) == {0x80000000}
    assert words(port.call("execute", b"sign", DATA.tobytes(), {"constants": {"S": 0.0}})) == {0}


def test_a_constants_set_that_breaks_the_compiler_leaves_the_kernel_for_other_sets(port):
    """BEFORE: N = 2**28 - 1 words (~1 GiB of workgroup memory) crashed the admission
    worker, and the refusal was remembered by the kernel's hash, on disk: every later
    call of the kernel, with any constants or none, was kernel_rejected."""
    reason, _ = refusal(port, "execute", b"wgarr", DATA.tobytes(), {"constants": {"N": 2**28 - 1}})
    assert reason in ("kernel_rejected", "bad_args", "too_large")
    out = port.call("execute", b"wgarr", DATA.tobytes(), {})
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), DATA * 2)
