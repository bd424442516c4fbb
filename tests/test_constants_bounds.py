"""Constants sets held to kem's bounds (issue 25, red team finding F2 and
the admissions per set): a var<workgroup> array sized by an override is
held per constants set to the 65,536 elements literal sizes are, refused
before any compile with bad_args naming the array and the limit, that set
only; the compile guard's admissions per constants set are an LRU of a
documented size, so endless distinct sets cannot grow the port, and a
refused set stays refused. Through the real port and the real guard."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import kernels_port
from kem_port.admission.admitted import MAX_ADMITTED_SETS
from kem_port.admission.guard import CompileGuard, GuardSettings
from kem_port.admission.limits import MAX_WORKGROUP_ELEMENTS as LITERAL_LIMIT
from kem_port.admission.rejects import RejectStore
from kem_port.client import PortError
from kem_port.errors import KemError
from kem_port.gpu.calls import KernelCall
from kem_port.gpu import constants
from kem_port.gpu.wgsl.wgsl_reflect import reflect
from kem_port.kernel_store import source_from_bytes
from kem_port.wire import terms

# A reversal through workgroup memory sized by N (each invocation writes and
# reads its own slot, so any N >= 64 gives the same answer).
WGARR = """
override N: u32 = 64;
var<workgroup> t: array<f32, N>;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gid.x;
    t[N - 1u - li] = a[min(i, arrayLength(&a) - 1u)];
    workgroupBarrier();
    if (i >= arrayLength(&b)) { return; }
    b[i] = t[N - 1u - li] * 2.0;
}
"""

# The same through an alias, a nested array and a size expression, by named
# buffers. (The override-sized level is the outer one: with it inner, kem's
# workgroup clearing on lavapipe wrote `array<f32, ROWS * 16u>()`, which WGSL
# cannot construct: shader_error. admission/zeroing.py, reported.)
NESTED = """
override ROWS: u32 = 4;
alias Tile = array<array<f32, 2>, ROWS * 16u>;
var<workgroup> tile: Tile;
@group(0) @binding(0) var<storage, read> xs: array<f32>;
@group(0) @binding(1) var<storage, read_write> ys: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gid.x;
    tile[li][1] = xs[min(i, arrayLength(&xs) - 1u)];
    workgroupBarrier();
    if (i >= arrayLength(&ys)) { return; }
    ys[i] = tile[li][1] + 1.0;
}
"""

# Each constants set a pipeline of its own; the output tells which.
SCALED = """
override S: f32 = 1.0;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&b)) { return; }
    b[i] = a[i] * S;
}
"""

KERNELS = {"wgarr": WGARR, "nested": NESTED, "scaled": SCALED}


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("bounds"), KERNELS) as port:
        yield port


def refusal(port, *args) -> PortError:
    with pytest.raises(PortError) as err:
        port.call(*args)
    return err.value


def test_the_limit_is_the_literal_sizes_limit():
    assert constants.MAX_WORKGROUP_ELEMENTS == LITERAL_LIMIT == 65_536


@pytest.mark.parametrize("n", [LITERAL_LIMIT + 1, 70_000, 2**20, 2**28 - 1])
def test_an_override_sized_workgroup_array_over_the_limit_is_refused_before_compiling(port, rng, n):
    """BEFORE: N = 65,537 .. 2^20 went to the compiler unchecked (a literal
    size that large is refused by admission/limits.py), and N = 2^28 - 1
    was refused only by the compile worker dying."""
    data = rng.standard_normal(100).astype(np.float32)
    err = refusal(port, "execute", b"wgarr", data.tobytes(), {"constants": {"N": n}})
    assert err.reason == "bad_args", err.detail
    assert "var<workgroup> t" in err.detail and "65536" in err.detail and f"N = {n}" in err.detail
    # that set only: the kernel runs with its default and with a set in bounds
    # (65,536 floats are within kem's count but 256 KiB, over the device's
    # workgroup memory: refused by bytes, gpu/workgroup_limits.py)
    err = refusal(port, "execute", b"wgarr", data.tobytes(), {"constants": {"N": LITERAL_LIMIT}})
    assert err.reason == "bad_args" and "262144 bytes of var<workgroup> memory" in err.detail, err.detail
    for opts in ({}, {"constants": {"N": 128}}, {"constants": {"N": 8192}}):
        out = np.frombuffer(port.call("execute", b"wgarr", data.tobytes(), opts), np.float32)
        np.testing.assert_array_equal(out, data * 2)


@pytest.mark.parametrize("rows", [4, 100])
def test_an_aliased_nested_array_with_a_size_expression_runs_within_the_limit(port, rng, rows):
    xs = rng.standard_normal(300).astype(np.float32)
    got = port.call("run", b"nested", {b"xs": xs.tobytes()},
                    {"outputs": {b"ys": xs.nbytes}, "grid": (300, 1, 1), "constants": {"ROWS": rows}})
    ys = {terms.binary_bytes(k).decode(): terms.binary_bytes(v) for k, v in got.items()}["ys"]
    np.testing.assert_array_equal(np.frombuffer(ys, np.float32), xs + 1)


def test_an_aliased_nested_array_over_the_limit_is_refused_by_named_buffers(port):
    # 2 x (ROWS * 16) elements: ROWS = 2049 makes 65,568.
    err = refusal(port, "run", b"nested", {b"xs": bytes(256)},
                  {"outputs": {b"ys": 256}, "grid": (64, 1, 1), "constants": {"ROWS": 2049}})
    assert err.reason == "bad_args" and "var<workgroup> tile" in err.detail and "65568" in err.detail, err.detail


@pytest.mark.parametrize("count,value", [("N", 7), ("N * 2u", 14), ("(N + 1) * 3", 24), ("N / 2", 3),
                                         ("N % 4", 3), ("64u", 64), ("LIMIT", None), ("f(N)", None),
                                         ("N ** 2", None), ("1e3", None), ("N / 0", None)])
def test_array_counts_kem_can_read(count, value):
    assert constants.count_value(count, {"N": 7}) == value


def test_consts_and_override_expression_defaults_are_read():
    """BEFORE: a count naming a const, or an override whose default is an
    expression (HALF = WG / 2u), was not read: left to the compile worker."""
    shape = reflect("override WG: u32 = 64;\noverride HALF: u32 = WG / 2u;\nconst TILE = 4u;\nconst TWICE = TILE * 2u;\n"
                    "var<workgroup> t: array<f32, TWICE * HALF>;\nvar<workgroup> big: array<u32, 70000>;\n"
                    "@compute @workgroup_size(1) fn main() { t[0] = 1.0; big[0] = 1u; }")
    assert shape.workgroup_vars == (("t", "array<f32, ((4u) * 2u) * HALF>"), ("big", "array<u32, 70000>"))
    assert shape.override_inits == (("WG", "64"), ("HALF", "WG / 2u"))
    constants.check_workgroup_arrays(shape, {"WG": 2 * 8192})  # 8 x 8,192 = 65,536: within
    with pytest.raises(KemError) as err:
        constants.check_workgroup_arrays(shape, {"WG": 2 * 8193})
    assert err.value.reason == "bad_args" and "var<workgroup> t" in err.value.detail and "HALF = 8193" in err.value.detail
    with pytest.raises(KemError):
        constants.check_workgroup_arrays(shape, {"WG": 64, "HALF": 9000})  # HALF given: its value, not the default's
    # a literal size over the limit is no set's fault: admission/limits.py refuses the kernel, not this check


def test_override_sized_counts_kem_cannot_read_are_refused():
    """BEFORE (red team of wave 3): left to the compile worker, which let
    max(N, 64u) with N = 2^26 run (256 MiB of workgroup memory, lavapipe).
    A count naming no override stays admission's (limits.py)."""
    shape = reflect("override N: u32 = 8;\nfn f() -> u32 { return 4u; }\nvar<workgroup> t: array<f32, f() * N>;\n"
                    "@compute @workgroup_size(1) fn main() { t[0] = 1.0; }")
    with pytest.raises(KemError) as err:
        constants.check_workgroup_arrays(shape, {"N": 2**30})
    assert err.value.reason == "bad_args" and "var<workgroup> t" in err.value.detail
    unread = reflect("override N: u32 = 8;\nvar<workgroup> t: array<f32, 4 * 4>;\n@compute @workgroup_size(1) fn main() { t[0] = 1.0; }")
    constants.check_workgroup_arrays(unread, {"N": 2**30})  # sized without N: not this check's


# A set that fails to compile: D = 0 divides by zero in an override's
# initializer, which naga evaluates when the pipeline is made.
DIVIDED = """
override D: u32 = 1;
override Q: u32 = 100u / D;
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x >= arrayLength(&out)) { return; }
    out[g.x] = inp[g.x] * Q;
}
"""


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    guard = CompileGuard(GuardSettings(timeout_s=4.0, memory_mb=512), RejectStore(tmp_path_factory.mktemp("rejected")))
    yield guard
    guard.close()


def test_admissions_per_constants_set_are_bounded_and_a_refused_set_stays_refused(guard):
    """BEFORE: every distinct constants set added an admission record that
    was never dropped: a stranger's endless sets grew the port by one each."""
    scaled, divided = source_from_bytes("scaled", SCALED.encode(), "kernels/scaled", "strict"), \
        source_from_bytes("divided", DIVIDED.encode(), "kernels/divided", "strict")
    call = lambda name, **c: KernelCall(name, b"", 4, constants=tuple(sorted(c.items())))  # noqa: E731
    with pytest.raises(KemError) as refused:
        guard.admit(divided, call("divided", D=0))
    assert refused.value.reason in ("shader_error", "bad_kernel"), refused.value.detail
    plain = len(guard.admitted)
    started = time.perf_counter()
    for k in range(MAX_ADMITTED_SETS + 40):  # distinct sets, each admitted once, the oldest pushed out
        guard.admit(scaled, call("scaled", S=1.0 + k))
        assert guard.describe()["admitted_constants_sets"] <= MAX_ADMITTED_SETS
    print(f"{MAX_ADMITTED_SETS + 40} sets admitted in {time.perf_counter() - started:.1f} s")
    assert guard.describe()["admitted_constants_sets"] == MAX_ADMITTED_SETS
    assert len(guard.admitted) == plain  # the lone road's dict does not grow by sets
    assert guard.is_admitted(scaled, call("scaled", S=1.0)) is None  # the first set, pushed out
    assert guard.is_admitted(scaled, call("scaled", S=1.0 + MAX_ADMITTED_SETS + 39)) is not None
    # a refused set stays refused after the flood; the kernel's other sets are admitted
    with pytest.raises(KemError) as again:
        guard.admit(divided, call("divided", D=0))
    assert again.value.reason == refused.value.reason
    assert guard.admit(divided, call("divided", D=4)) is not None
    assert guard.admit(scaled, call("scaled", S=1.0)) is not None  # admitted again on its next call


def test_a_set_pushed_out_runs_right_through_the_port(port, rng):
    """The port's side: a set admitted again after being pushed out computes with its value."""
    data = rng.standard_normal(100).astype(np.float32)
    for scale in (2.0, 3.0, 2.0):
        out = np.frombuffer(port.call("execute", b"scaled", data.tobytes(), {"constants": {"S": scale}}), np.float32)
        np.testing.assert_array_equal(out, data * np.float32(scale))
