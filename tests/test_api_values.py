"""The Python API's edge (red team of wave 3, /faces): one rule for arrays
on every road. Arrays go up little-endian (the GPU's order) and come back
as the dtype asked for, whatever its byte order; object arrays are refused
as bad_args (their bytes are this process's heap pointers); a bad out_shape
is bad_args; closing a Session twice is a no-op. Values against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kem_port import api
from kem_port.errors import KemError

ADD = """@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&c)) { c[g.x] = a[g.x] + b[g.x]; } }
"""


@pytest.mark.parametrize("n", [4, 100, 1000])
def test_big_endian_arrays_go_up_and_come_back_by_value(rng, n):
    w = rng.integers(0, 2**31, n, dtype=np.uint32)
    assert np.array_equal(api.run("double", w.astype(">u4")), (w * 2).astype(">u4"))
    assert np.array_equal(api.run("double", w, dtype=">u4"), (w * 2).astype(">u4"))


def test_big_endian_named_buffers_by_value(rng, tmp_path):
    kernel = tmp_path / "add.wgsl"
    kernel.write_text(ADD)
    a, b = rng.random(77, dtype=np.float32), rng.random(77, dtype=np.float32)
    got = api.run_named(kernel, {"a": a.astype(">f4"), "b": b.astype(">f4")}, outputs={"c": ((77,), ">f4")}, grid=(77, 1, 1))
    assert np.allclose(got["c"], a + b)


def test_a_session_keeps_big_endian_values():
    with api.Session() as s:
        w = np.arange(6, dtype=np.uint32)
        s.put("a", w.astype(">u4"))
        assert np.array_equal(s.read("a", dtype=np.uint32), w)
        assert np.array_equal(s.read("a", dtype=">u4"), w)
        s.close()  # a second close (by __exit__) is a no-op


@pytest.mark.parametrize("call", [
    lambda: api.run("double", np.array([1, 2, 3], dtype=object)),
    lambda: api.run("double", np.arange(4, dtype=np.uint32), dtype=object),
    lambda: api.run("double", np.arange(4, dtype=np.uint32), out_shape="x"),
    lambda: api.run("double", np.arange(4, dtype=np.uint32), dtype="not a dtype"),
])
def test_what_has_no_bytes_is_bad_args(call):
    with pytest.raises(KemError) as caught:
        call()
    assert caught.value.reason == "bad_args"


def test_a_session_refuses_object_arrays():
    with api.Session() as s:
        with pytest.raises(KemError) as caught:
            s.put("o", np.array([1, 2], dtype=object))
        assert caught.value.reason == "bad_args" and "object" in caught.value.detail
