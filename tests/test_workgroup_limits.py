"""var<workgroup> memory held to the device's maxComputeWorkgroupStorageSize
(gpu/workgroup_limits.py): wgpu-native does not hold it. lavapipe (32 KiB)
ran 256 KiB; on an H100 (48 KiB) such a kernel's first call never returned
and the port was stuck for good. Sizes by WGSL's layout rules, each
variable the entry point uses rounded up to 16 bytes, checked on every road
that builds a pipeline; kernels within the limit run and match numpy."""

from __future__ import annotations

import json
import numpy as np
import pytest

from conftest import kernels_port
from kem_port.client import PortError
from kem_port.errors import KemError
from kem_port.gpu.workgroup_limits import check_workgroup_limits
from kem_port.gpu.wgsl.wgsl_reflect import reflect
from kem_port.gpu.constants import count_value
from kem_port.wire import terms
from kem_port.gpu.wgsl.wgsl_workgroup_bytes import workgroup_bytes


# Sizes by the WGSL spec's "Alignment and Size" table, worked by hand.
LAYOUTS = [
    ("f32", 4), ("f16", 2), ("bool", 4), ("atomic<u32>", 4),
    ("vec3<f32>", 12), ("vec3f", 12), ("vec2h", 4), ("vec4<i32>", 16),
    ("mat3x3<f32>", 48), ("mat2x2f", 16), ("mat4x3h", 32), ("mat3x2<f32>", 24),
    ("array<vec3<f32>, 3>", 48), ("array<f16, 3>", 6), ("array<array<f32, 4>, 8>", 128),
    ("S", 32), ("array<S, 10>", 320), ("P", 80), ("array<P, 2>", 160), ("Row", 256), ("array<Row, 2u>", 512),
    ("array<u32, ALL>", 4096), ("Q", 8),
    # What a stranger could use to hide bytes (attack on the first version):
    ("Big", 65536), ("vec4f", 4000), ("array<u32, 0x100>", 1024), ("Tiles", 1024),
]
TYPES = """
struct S { a: f32, b: vec4<f32> }
struct P { @size(64) v: array<u32, 4>, w: vec3f }
struct Q { a: f16, @align(4) b: f16 }
alias Row = array<f32, 64>;
const ALL = 4u * 256u;
const HUGE = 65536;
struct Big { @size(HUGE) a: f32 }
struct vec4f { a: array<f32, 1000> }
const K = 0x40u;
struct Tiles { a: array<f32, K * 2u>, b: array<f32, 128> }
"""


def test_workgroup_bytes_follow_wgsl_layout_rules():
    text = TYPES + "".join(f"var<workgroup> v{i}: {t};\n" for i, (t, _) in enumerate(LAYOUTS))
    got = dict(workgroup_bytes(text + "@compute @workgroup_size(1) fn main() {}"))
    assert [count_value(got[f"v{i}"], {}) for i in range(len(LAYOUTS))] == [size for _, size in LAYOUTS]


def test_an_override_sized_array_is_an_expression_and_an_unknown_type_is_unread():
    got = dict(workgroup_bytes("override N: u32 = 4;\nvar<workgroup> t: array<vec4f, max(N, 1u)>;\n"
                               "var<workgroup> u: Mystery;\nstruct W { @size(f()) a: f32 }\nvar<workgroup> w: W;\n"
                               "@compute @workgroup_size(1) fn main() {}"))
    assert got == {"t": "(max(N, 1u)) * 16", "u": None, "w": None}  # an @size kem cannot read could hide bytes


HEAD = """@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
"""
# b[i] = a[i] * 2 through workgroup memory of ROWS rows of 64 floats.
BODY = """@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gid.x;
    t[ROWS_LAST][li] = a[min(i, arrayLength(&a) - 1u)];
    workgroupBarrier();
    if (i < arrayLength(&b)) { b[i] = t[ROWS_LAST][li] * 2.0; }
}
"""
# Two entry points, each with its own 24 KiB: 48 KiB in the module, 24 KiB each.
TWO = HEAD + """var<workgroup> left: array<f32, 6144>;
var<workgroup> right: array<f32, 6144>;
@compute @workgroup_size(64) fn twice(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    left[li * 96u] = a[min(g.x, arrayLength(&a) - 1u)];
    workgroupBarrier();
    if (g.x < arrayLength(&b)) { b[g.x] = left[li * 96u] * 2.0; }
}
@compute @workgroup_size(64) fn thrice(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    right[li * 96u] = a[min(g.x, arrayLength(&a) - 1u)];
    workgroupBarrier();
    if (g.x < arrayLength(&b)) { b[g.x] = right[li * 96u] * 3.0; }
}
"""


def literal(rows: int) -> str:
    return HEAD + f"var<workgroup> t: array<array<f32, 64>, {rows}>;\n" + BODY.replace("ROWS_LAST", f"{rows - 1}u")


KERNELS = {
    "rows_128": literal(128),  # 32 KiB: lavapipe's limit (an H100's is 48 KiB)
    "rows_1024": literal(1024),  # 256 KiB: stuck an H100's port
    "by_override": "override N: u32 = 4;\n" + HEAD + "var<workgroup> t: array<array<f32, 64>, N>;\n"
                   + BODY.replace("ROWS_LAST", "N - 1u"),
    "two_entries": TWO,
    # An override whose default names a module const (red team 9: refused as unreadable before).
    "const_default": "const C = 16u;\noverride N: u32 = C * 4u;\n" + HEAD + "var<workgroup> t: array<array<f32, 64>, N>;\n"
                     + BODY.replace("ROWS_LAST", "N - 1u"),
}


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("wg_limits"), KERNELS) as p:
        yield p


@pytest.fixture(scope="module")
def limit(port) -> int:
    """This device's maxComputeWorkgroupStorageSize, as adapter_info reports it."""
    return json.loads(port.call("adapter_info"))["limits"]["max_compute_workgroup_storage_size"]


def refusal(call) -> PortError:
    with pytest.raises(PortError) as err:
        call()
    return err.value


@pytest.mark.parametrize("n", [1, 200, 4096])
def test_kernels_at_the_limit_run_on_every_road(port, rng, n):
    data = rng.standard_normal(n).astype(np.float32)
    want = (data * 2).tobytes()
    assert port.call("execute", b"rows_128", data.tobytes(), {}) == want
    assert port.call("execute", b"by_override", data.tobytes(), {"constants": {"N": 128}}) == want
    named = port.call("run", b"rows_128", {b"a": data.tobytes()}, {"outputs": {b"b": data.nbytes}, "grid": (n, 1, 1)})
    assert [terms.binary_bytes(v) for v in named.values()] == [want]
    session = port.session_open()
    assert session.call("by_override", data.tobytes(), constants={"N": 64}) == want
    session.close()


def test_memory_over_the_limit_is_refused_on_every_road_and_the_port_stays(port, rng, limit):
    data = rng.standard_normal(100).astype(np.float32).tobytes()
    for call in (lambda: port.call("execute", b"rows_1024", data, {}),
                 lambda: port.call("run", b"rows_1024", {b"a": data}, {"outputs": {b"b": 400}, "grid": (100, 1, 1)})):
        err = refusal(call)
        assert err.reason == "bad_kernel", err
        assert "uses 262144 bytes of var<workgroup> memory (t 262144;" in err.detail
        assert f"limit of {limit} bytes (maxComputeWorkgroupStorageSize)" in err.detail
    at = limit // 256  # rows of 64 floats
    assert port.call("execute", b"by_override", data, {"constants": {"N": at}}) == (np.frombuffer(data, np.float32) * 2).tobytes()
    for call in (lambda: port.call("execute", b"by_override", data, {"constants": {"N": at + 1}}),
                 lambda: port.session_open().call("by_override", data, constants={"N": at + 1})):
        err = refusal(call)
        assert err.reason == "bad_args" and err.detail.startswith(f"constants: entry point main uses {(at + 1) * 256} bytes"), err
    assert port.call("execute", b"rows_128", data, {}) == (np.frombuffer(data, np.float32) * 2).tobytes()


def test_each_entry_point_counts_only_the_memory_it_uses(port, rng):
    data = rng.standard_normal(300).astype(np.float32)
    for entry, factor in (("twice", 2), ("thrice", 3)):
        out = port.call("execute", b"two_entries", data.tobytes(), {"entry_point": entry})
        np.testing.assert_array_equal(np.frombuffer(out, np.float32), data * np.float32(factor))


def test_an_override_default_naming_a_const_is_counted(port, rng, limit):
    data = rng.standard_normal(500).astype(np.float32)
    want = (data * 2).tobytes()
    assert port.call("execute", b"const_default", data.tobytes(), {}) == want  # N = 64: 16 KiB
    assert port.call("execute", b"const_default", data.tobytes(), {"constants": {"N": 8}}) == want
    err = refusal(lambda: port.call("execute", b"const_default", data.tobytes(), {"constants": {"N": limit // 256 + 1}}))
    assert err.reason == "bad_args" and f"uses {(limit // 256 + 1) * 256} bytes" in err.detail, err


def test_a_parameter_named_like_a_function_does_not_hide_memory():
    """BEFORE (review's red team, 68263c6): f's parameter g read as a call
    of g closed a cycle; big (64 KiB) was counted for no entry point, and
    a device of 48 KiB would have got it (an H100's port waits for good)."""
    text = ("@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n"
            "var<workgroup> big: array<u32, 16384>;\n"
            "fn f(i: u32, g: u32) -> u32 { big[i] = i + g; workgroupBarrier(); return big[16383u - i]; }\n"
            "fn g(i: u32) -> u32 { return f(i, 1u); }\n"
            "@compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) { out[i] = g(i); }\n")
    shape = reflect(text)
    with pytest.raises(KemError) as err:
        check_workgroup_limits(shape.entry_points["main"], {"max-compute-workgroup-storage-size": 49152}, text, shape, None)
    assert err.value.reason == "bad_kernel" and "uses 65536 bytes" in err.value.detail, err.value
