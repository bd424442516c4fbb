"""One Python API (issue 26): kem_port.api's sessions, chains, debug
records, health and adapters, numpy in and out with dtypes and shapes, on
the real port process and the real adapter; one error type (KemError).
Values against numpy on fresh random inputs of several sizes."""

from __future__ import annotations

import numpy as np
import pytest

from kem_port import api
from kem_port.client import PortError
from kem_port.errors import KemError
from test_named_buffers import KERNELS
from test_sessions import KERNELS as SESSION_KERNELS

DEBUG_ECHO = """struct KemDebug { count: atomic<u32>, records: array<u32> }
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(15) var<storage, read_write> kem_debug: KemDebug;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i] + 1u;
    let r = atomicAdd(&kem_debug.count, 1u);
    if (r < arrayLength(&kem_debug.records)) { kem_debug.records[r] = input_words[i]; }
}
"""


@pytest.fixture(scope="module")
def kernel_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api_session")
    for name in ("add", "axpy"):
        (folder / f"{name}.wgsl").write_text(KERNELS[name])
    for path in __import__("pathlib").Path(SESSION_KERNELS).glob("*.wgsl"):
        (folder / path.name).write_text(path.read_text())
    return folder


@pytest.fixture(scope="module")
def port(kernel_folder):
    with api.Port({"KEM_KERNEL_DIR": str(kernel_folder)}) as local:
        yield local


def test_port_error_is_the_one_error_type():
    """BEFORE: PortError was its own Exception; catching KemError missed it."""
    assert PortError is KemError or issubclass(PortError, KemError)
    err = PortError("bad_args", "x", 3)
    assert (err.reason, err.detail, err.step, str(err)) == ("bad_args", "x", 3, "bad_args at step 3: x")


@pytest.mark.parametrize("shape", [(3, 5), (64, 64, 4), (7,)])
def test_run_keeps_the_inputs_shape_or_takes_out_shape(rng, shape):
    """BEFORE: api.run returned a flat array; an image lost its shape."""
    data = rng.integers(0, 2**32, size=shape, dtype=np.uint32)
    out = api.run("double", data)
    assert out.shape == data.shape and out.dtype == np.uint32
    np.testing.assert_array_equal(out, data * np.uint32(2))
    flat = api.run("double", data, out_shape=(data.size,))
    assert flat.shape == (data.size,)
    as_bytes = api.run("double", data, dtype=np.uint8)  # another dtype: flat
    assert as_bytes.shape == (data.nbytes,)
    with pytest.raises(KemError) as err:
        api.run("double", data, out_shape=(data.size + 1,))
    assert err.value.reason == "bad_args"


@pytest.mark.parametrize("n", [1, 100, 4097])
def test_run_debug_gives_output_and_records(tmp_path, rng, n):
    (tmp_path / "echo.wgsl").write_text(DEBUG_ECHO)
    words = rng.integers(0, 2**31, size=n, dtype=np.uint32)
    got = api.run_debug(tmp_path / "echo.wgsl", words)
    np.testing.assert_array_equal(got.output, words + np.uint32(1))
    # Invocations run in any order: the records are the inputs, as a multiset.
    kept = len(got.records)
    assert kept + got.dropped == n
    assert np.isin(np.array(got.records, dtype=np.uint32), words).all()
    if got.dropped == 0:
        np.testing.assert_array_equal(np.sort(np.array(got.records, dtype=np.uint32)), np.sort(words))


@pytest.mark.parametrize("n", [4, 1000, 50_000])
def test_session_buffers_keep_dtype_and_shape_and_state(port, rng, n):
    acc0 = rng.integers(0, 2**20, size=n, dtype=np.uint32)
    step = rng.integers(0, 2**20, size=n, dtype=np.uint32)
    with port.session() as s:
        s.put("acc", acc0)
        s.zeros("zeros", (2, 3), np.float32)
        assert s.buffers() == {"acc": acc0.nbytes, "zeros": 24}
        back = s.read("zeros")
        assert back.dtype == np.float32 and back.shape == (2, 3) and not back.any()
        for k in range(1, 3):  # state stays on the GPU between calls
            out = s.call("accumulate", step)
            np.testing.assert_array_equal(out, acc0 + np.uint32(k) * step)
        np.testing.assert_array_equal(s.read("acc"), acc0 + np.uint32(2) * step)
        s.write("acc", np.zeros(1, np.uint32), offset=4 * (n - 1))
        assert s.read("acc", offset=4 * (n - 1), length=4)[0] == 0
        s.free("acc")
        with pytest.raises(KemError) as err:
            s.read("acc")
        assert err.value.reason == "no_buffer"


@pytest.mark.parametrize("n", [1, 300, 10_000])
def test_named_call_and_chain_with_shaped_outputs(port, rng, n):
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    with port.session() as s:
        s.put("a", a)
        got = s.call("add", buffers={"b": b}, outputs={"c": ((n,), np.float32)}, grid=(n, 1, 1))
        assert set(got) == {"c"} and got["c"].dtype == np.float32
        np.testing.assert_array_equal(got["c"], a + b)
        steps = [{"kernel": "add", "buffers": {"b": b}, "outputs": {"c": ((n,), np.float32)}, "grid": (n, 1, 1)},
                 {"kernel": "add", "bind": {"b": "c", "c": "e"}, "outputs": {"e": ((1, n), np.float32)}, "grid": (n, 1, 1)}]
        both = s.chain(steps, returns=["c", "e"])
        np.testing.assert_array_equal(both["c"], a + b)
        assert both["e"].shape == (1, n)
        np.testing.assert_array_equal(both["e"][0], a + (a + b))


def test_chain_without_a_session_and_a_failing_step(port, rng):
    data = rng.integers(0, 2**30, size=777, dtype=np.uint32)
    twice = port.chain([{"kernel": "double"}, {"kernel": "double"}], input=data)
    np.testing.assert_array_equal(twice, data * np.uint32(4))
    with pytest.raises(KemError) as err:
        port.chain([{"kernel": "double"}, {"kernel": "no_such_kernel"}], input=data)
    assert (err.value.reason, err.value.step) == ("kernel_not_found", 2)


def test_health_and_adapters_answer_like_the_port(port):
    here = api.health()
    assert here == port.health()
    assert here["usable"] is True and here["kind"] in ("gpu", "cpu", "other")
    listing = api.adapters()
    assert listing["kem_picks"] is not None and listing["adapters"][listing["kem_picks"]]["name"] == here["adapter"]


def test_a_session_without_a_port_uses_the_shared_local_port(rng):
    data = rng.integers(0, 2**32, size=(5, 7), dtype=np.uint32)
    with api.Session() as s:
        s.put("grid", data)
        np.testing.assert_array_equal(s.read("grid"), data)
        assert s.port is api.local_port()
    with api.Session() as again:  # the same process serves the next session
        assert again.port is s.port and again.buffers() == {}
