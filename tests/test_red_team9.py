"""Red team 9: the workgroup-memory byte count (gpu/wgsl/wgsl_workgroup_bytes.py,
gpu/workgroup_limits.py). Each finding is a kernel naga accepts whose memory
by WGSL's layout rules is over the device's maxComputeWorkgroupStorageSize
(lavapipe 32 KiB, an H100 48 KiB) while kem counted less and let it run;
each is refused now, and its within-limit twin runs and matches numpy.

1. A function-scope ``const`` read as the module's: WGSL's module scope has
   no order, so ``fn f() { const N = 2; } const N = 16384;`` is valid, and
   the declaration reader took the first ``N`` it met (the function's):
   ``array<f32, N>`` counted 4 bytes, 65,536 real. The same hid an
   ``override N``; an ``@workgroup_size(W)`` of a module const was read
   as 2 too, but wgpu-native holds const workgroup sizes itself.
2. A scalar name shadowed by an alias inside a vector or matrix:
   ``alias f16 = f32; array<vec4<f16>, 4096>`` was sized as f16 vectors
   (32,768 bytes, at lavapipe's limit) where naga lays out f32 (65,536).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import kernels_port
from kem_port.client import PortError
from kem_port.errors import KemError
from kem_port.gpu.constants import count_value
from kem_port.gpu.workgroup_limits import check_workgroup_limits
from kem_port.gpu.wgsl.wgsl_reflect import reflect
from kem_port.gpu.wgsl.wgsl_workgroup_bytes import workgroup_bytes

HEAD = """@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
"""
ENTRY = """@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    STORE
    workgroupBarrier();
    if (g.x < arrayLength(&b)) { b[g.x] = LOAD * scale(); }
}
"""
X = "a[min(g.x, arrayLength(&a) - 1u)]"


def kernel(decls: str, store: str, load: str) -> str:
    return HEAD + decls + ENTRY.replace("STORE", store).replace("LOAD", load)


def local_const(n: int) -> str:
    # The function's const N comes first in the text; the module's N sizes t.
    return kernel(f"fn scale() -> f32 {{ const N = 2; return f32(N); }}\nconst N = {n};\nvar<workgroup> t: array<f32, N>;\n",
                  f"t[li * {n // 64}u] = {X};", f"t[li * {n // 64}u]")


def local_over_override(n: int) -> str:
    return kernel(f"fn scale() -> f32 {{ const N = 2u; return f32(N); }}\noverride N: u32 = {n}u;\n"
                  "var<workgroup> t: array<f32, N>;\n", f"t[li * {n // 64}u] = {X};", f"t[li * {n // 64}u]")


def alias_vec(n: int) -> str:
    return kernel(f"fn scale() -> f32 {{ return 2.0; }}\nalias f16 = f32;\nvar<workgroup> t: array<vec4<f16>, {n}>;\n",
                  f"t[li * {n // 64}u] = vec4<f16>({X});", f"t[li * {n // 64}u].w")


def alias_mat(n: int) -> str:
    return kernel(f"fn scale() -> f32 {{ return 2.0; }}\nalias f16 = f32;\nvar<workgroup> t: array<mat4x4<f16>, {n}>;\n",
                  f"t[li * {n // 64}u][3] = vec4<f32>({X});", f"t[li * {n // 64}u][3].z")


WORKGROUP_CONST = HEAD + """fn scale() -> f32 { const W = 2; return f32(W); }
const W = 4096;
@compute @workgroup_size(W) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&b)) { b[g.x] = a[min(g.x, arrayLength(&a) - 1u)] * scale(); }
}
"""

# name: (kernel over every device's limit, its real bytes, its twin within lavapipe's 32 KiB)
OVER = {
    "local_const": (local_const(16384), 65536, local_const(4096)),
    "local_over_override": (local_over_override(16384), 65536, local_over_override(4096)),
    "alias_vec": (alias_vec(4096), 65536, alias_vec(1024)),
    "alias_mat": (alias_mat(1024), 65536, alias_mat(256)),
}


@pytest.mark.parametrize("name", sorted(OVER))
def test_workgroup_bytes_are_naga_s_layout(name):
    over, real, within = OVER[name]
    got = dict(workgroup_bytes(over))
    assert count_value(got["t"], {"N": 16384}) == real  # before: 4, 4, 32768, 32768
    assert count_value(dict(workgroup_bytes(within))["t"], {"N": 4096}) == real // 4


def test_a_module_const_sizes_the_workgroup_not_a_function_s():
    entry = reflect(WORKGROUP_CONST).entry_points["main"]
    assert dict(reflect(WORKGROUP_CONST).const_inits)["W"] == "4096"  # before: "2" (the function's)
    assert entry.workgroup_size_text == "W"


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    kernels = {f"{name}_over": k[0] for name, k in OVER.items()} | {f"{name}_within": k[2] for name, k in OVER.items()}
    kernels["workgroup_const"] = WORKGROUP_CONST
    with kernels_port(tmp_path_factory.mktemp("red9"), kernels) as p:
        yield p


@pytest.mark.parametrize("name", sorted(OVER))
def test_over_the_limit_is_refused_and_the_twin_runs(port, rng, name):
    for n in (1, 100, 1000):
        data = rng.standard_normal(n).astype(np.float32)
        out = port.call("execute", f"{name}_within".encode(), data.tobytes(), {})
        np.testing.assert_array_equal(np.frombuffer(out, np.float32), data * np.float32(2))
    with pytest.raises(PortError) as err:
        port.call("execute", f"{name}_over".encode(), data.tobytes(), {})
    assert err.value.reason in ("bad_kernel", "bad_args"), err.value  # bad_args where an override sizes it
    assert f"uses {OVER[name][1]} bytes of var<workgroup> memory" in err.value.detail, err.value


def test_a_workgroup_size_of_a_module_const_is_held_to_the_device(port, rng):
    """Not a finding: wgpu-native itself holds a const-sized workgroup to
    the device (it lets only override-sized ones through, which kem
    resolves), so the function's W = 2 read as the module's changed no
    outcome; reflect reads the module's W now (test above)."""
    with pytest.raises(PortError) as err:
        port.call("execute", b"workgroup_const", rng.standard_normal(10).astype(np.float32).tobytes(), {})
    assert err.value.reason == "bad_kernel" and "max_compute_invocations_per_workgroup` of 1024" in err.value.detail, err.value
    data = rng.standard_normal(50).astype(np.float32)
    out = port.call("execute", b"local_const_within", data.tobytes(), {})
    np.testing.assert_array_equal(np.frombuffer(out, np.float32), data * np.float32(2))


# 3. A var template naga reads but kem's readers did not: var<(workgroup)>
# (and var<workgroup,>). The byte count saw no variable (64 KiB ran), and
# the clearing saw none either (its token count, regex and reader all
# missed it): a reader that never writes its workgroup memory read the
# previous caller's secrets on lavapipe. Both are refused now.
U32_HEAD = """@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
"""
WRITER = U32_HEAD + """var<workgroup> secret: array<u32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) w: vec3<u32>) {
    secret[i] = inp[w.x * 256u + i];
    workgroupBarrier();
    out[w.x * 256u + i] = secret[255u - i];
}
"""
TEMPLATES = ("var<(workgroup)>", "var<((workgroup))>", "var<workgroup,>")


def hidden_reader(template: str) -> str:
    return U32_HEAD + f"""{template} secret: array<u32, 256>;
@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {{
    let i = l.x + l.y * 16u;
    out[w.x * 256u + i] = secret[i] | (inp[0] & 0u);
}}
"""


def hidden_big(template: str) -> str:
    return kernel(f"fn scale() -> f32 {{ return 2.0; }}\n{template} t: array<f32, 16384>;\n", f"t[li * 256u] = {X};", "t[li * 256u]")


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_workgroup_template_is_counted_or_refused(template):
    from kem_port.admission.zeroing import zero_workgroup_memory
    from kem_port.errors import KemError
    from kem_port.gpu.workgroup_limits import check_workgroup_limits
    text = hidden_big(template)
    shape = reflect(text)
    with pytest.raises(KemError) as err:
        check_workgroup_limits(shape.entry_points["main"], {"max-compute-workgroup-storage-size": 32768}, text, shape, None)
    assert err.value.reason == "bad_kernel" and "a var<workgroup> declaration kem cannot read" in err.value.detail
    with pytest.raises(KemError) as err:
        zero_workgroup_memory(hidden_reader(template))
    assert err.value.reason == "kernel_rejected"


# (Non-finding 3.) The clearing now clears only what an entry can name; an
# entry reads a variable only by naming it in a function it reaches, here
# through two helpers (one reading it, one never called naming another).
HELPER_READER = U32_HEAD + """var<workgroup> secret: array<u32, 256>;
var<workgroup> other: array<u32, 4096>;
fn peek(i: u32) -> u32 { return secret[i]; }
fn reach(i: u32) -> u32 { return peek(i) | 0u; }
fn unused() { other[0] = 1u; }
@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let i = l.x + l.y * 16u;
    out[w.x * 256u + i] = reach(i) | (inp[0] & 0u);
}
"""


@pytest.fixture(scope="module")
def hidden_port(tmp_path_factory):
    kernels = {"wg_write": WRITER, "helper_reader": HELPER_READER} | {f"hidden_{i}": hidden_reader(t) for i, t in enumerate(TEMPLATES)}
    with kernels_port(tmp_path_factory.mktemp("red9_hidden"), kernels) as p:
        yield p


@pytest.mark.parametrize("index", range(len(TEMPLATES)))
def test_a_hidden_workgroup_template_never_reads_the_previous_caller(hidden_port, rng, index):
    for groups in (4, 8, 4):  # a leak shows in most rounds on lavapipe, not all
        secret = rng.integers(1, 2**32, 256 * groups, dtype=np.uint32)
        written = np.frombuffer(hidden_port.call("execute_kernel", b"wg_write", secret.tobytes(), 1), np.uint32)
        assert np.array_equal(written, secret.reshape(groups, 256)[:, ::-1].ravel())
        with pytest.raises(PortError) as err:  # before: var<(workgroup)> ran uncleared and read the secret back
            hidden_port.call("execute", f"hidden_{index}".encode(), bytes(1024 * groups), {"workgroups": (groups, 1, 1)})
        assert err.value.reason == "kernel_rejected", err.value


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_hidden_template_over_the_limit_is_refused_without_the_clearing(tmp_path, rng, template):
    """KEM_ZERO_WORKGROUP=off (or auto on an adapter that does not leak, as
    a GPU may not): the byte count alone stands between it and the GPU."""
    kernels = {"big": hidden_big(template), "within": local_const(4096)}
    with kernels_port(tmp_path, kernels, KEM_ZERO_WORKGROUP="off") as port:
        data = rng.standard_normal(300).astype(np.float32)
        out = port.call("execute", b"within", data.tobytes(), {})
        np.testing.assert_array_equal(np.frombuffer(out, np.float32), data * np.float32(2))
        with pytest.raises(PortError) as err:  # before: 65,536 bytes ran
            port.call("execute", b"big", data.tobytes(), {})
        # Admission refuses the form itself now (admission/limits.py: var templates written plainly) ...
        assert err.value.reason == "kernel_rejected" and "plainly" in err.value.detail, err.value
    # ... and the byte count, behind it, still refuses a declaration it cannot read.
    text = hidden_big(template)
    shape = reflect(text)
    with pytest.raises(KemError) as err:
        check_workgroup_limits(shape.entry_points["main"], {"max-compute-workgroup-storage-size": 32768}, text, shape, None)
    assert err.value.reason == "bad_kernel" and "a var<workgroup> declaration kem cannot read" in err.value.detail, err.value


# 4. A road that built a pipeline without the count: the named road's
# compile (kem check's), which said ok (and built the pipeline) for 256 KiB
# that run refuses.
def test_kem_check_holds_the_named_road_to_the_device_limit(tmp_path):
    import json
    from cli_helpers import kem
    for name, text, ok in (("big", local_const(16384), False), ("within", local_const(4096), True)):
        path = tmp_path / f"{name}.wgsl"
        path.write_text(text)
        report = json.loads(kem(tmp_path, "check", str(path), "--json").stdout)
        assert report["ok"] is ok and report["named"]["ok"] is ok, report  # before: named ok for 65,536 bytes
        if not ok:
            assert report["reason"] == "bad_kernel" and "uses 65536 bytes" in report["error"], report
            assert [p for p in report["named"]["problems"] if p.startswith("bad_kernel: entry point main uses 65536 bytes")], report


# Non-findings, kept as checks.
# (a) Layouts naga refuses, so kem's reading of them never matters, and
# template forms kem cannot read, refused rather than guessed.
REFUSED_BY_NAGA = ("struct Q { a: f32, @align(4) b: vec4<f32> }", "struct Q { @size(4) b: vec4<f32> }",
                   "struct Q { a: f32, @align(8) b: vec3<f32> }")


@pytest.mark.parametrize("struct", REFUSED_BY_NAGA)
def test_an_under_aligned_or_under_sized_member_is_naga_s_to_refuse(struct):
    import wgpu
    text = HEAD + struct + "\nvar<workgroup> t: Q;\n@compute @workgroup_size(1) fn main() { _ = &t; b[0] = a[0]; }\n"
    with pytest.raises(wgpu.GPUError):
        wgpu.utils.get_default_device().create_shader_module(code=text)


@pytest.mark.parametrize("type_text", ["array<f32, 16384,>", "array<vec4<f32,>, 4096>", "atomic<U>", "array<f32, N2>"])
def test_a_type_kem_cannot_read_is_unread_not_guessed(type_text):
    text = "alias U = u32;\nconst N2 = u32(16384);\n" + f"var<workgroup> t: {type_text};\n@compute @workgroup_size(1) fn main() {{ _ = &t; }}\n"
    got = dict(workgroup_bytes(text))["t"]
    assert got is None or count_value(got, {}) is None


# (b) The reader on pathological kernels answers in well under a second
# each here (2-core machine; the bound is loose for load), and refuses
# what it cannot size.
PATHOLOGICAL = {
    "struct_chain": "struct S0 { a: f32 }\n" + "".join(f"struct S{i} {{ a: S{i-1}, b: S{i-1} }}\n" for i in range(1, 10000))
                    + "var<workgroup> w: S9999;",
    "const_chain": "const C0 = 1;\n" + "".join(f"const C{i} = C{i-1} + C{i-1};\n" for i in range(1, 10000))
                   + "var<workgroup> w: array<f32, C9999>;",
    "deep_array": "var<workgroup> w: " + "array<" * 3000 + "f32" + ", 1>" * 3000 + ";",
    "long_count": "var<workgroup> w: array<f32, " + "+".join(["1"] * 60000) + ">;",
    "parens": "var<" + "(" * 200000 + "workgroup" + ")" * 200000 + "> w: f32;",
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_kernels_are_refused_quickly(name):
    import time
    from kem_port.errors import KemError
    from kem_port.gpu.workgroup_limits import _check_storage
    text = PATHOLOGICAL[name] + "\n@compute @workgroup_size(1) fn main() { _ = &w; }\n"
    started = time.perf_counter()
    with pytest.raises(KemError) as err:
        _check_storage("main", {"max-compute-workgroup-storage-size": 32768}, text, reflect(HEAD + "@compute @workgroup_size(1) fn main() {}"), None)
    assert err.value.reason == "bad_kernel" and "kem cannot read" in err.value.detail
    assert time.perf_counter() - started < 5.0


def test_a_variable_read_through_helpers_is_cleared(hidden_port, rng):
    for groups in (4, 8, 4, 8):  # a leak shows in most rounds on lavapipe, not all
        secret = rng.integers(1, 2**32, 256 * groups, dtype=np.uint32)
        hidden_port.call("execute_kernel", b"wg_write", secret.tobytes(), 1)
        read = hidden_port.call("execute", b"helper_reader", bytes(1024 * groups), {"workgroups": (groups, 1, 1)})
        assert len(read) == 1024 * groups and not any(read), "workgroup memory leaked from the previous caller"
