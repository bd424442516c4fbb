"""kem_port.api against numpy on fresh random inputs, in this process, on
the real adapter; and the client's plain-Python replies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import reference
from conftest import start_port
from kem_port import api
from kem_port.client import plain
from kem_port.config import Config
from kem_port.errors import KemError

KERNELS = Path(__file__).parents[1] / "kem_port" / "kernels"
ADD_PARAM = """
struct P { add: u32, }
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@group(0) @binding(2) var<uniform> p: P;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&b)) { b[g.x] = a[g.x] + p.add; }
}
@compute @workgroup_size(64)
fn sub(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&b)) { b[g.x] = a[g.x] - p.add; }
}
"""


@pytest.mark.parametrize("n", [1, 257, 100_003])
def test_run_numpy_in_numpy_out(rng, n):
    words = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    out = api.run("double", words)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint32
    np.testing.assert_array_equal(out, words * np.uint32(2))


def test_run_bytes_hint_and_output_size(rng):
    data = rng.bytes(1001)
    assert api.run("double", data, hint=3) == reference.double(data, 3003)
    assert api.run(KERNELS / "double.wgsl", data, output_size=10) == reference.double(data, 10)
    as_bytes = api.run("double", data[:1000], dtype=np.uint8)
    np.testing.assert_array_equal(as_bytes, np.frombuffer(reference.double(data[:1000], 1000), dtype=np.uint8))


def test_runner_with_its_own_kernel_dir(tmp_path, rng):
    (tmp_path / "addp.wgsl").write_text(ADD_PARAM)
    runner = api.Runner(Config(kernel_dir=tmp_path))
    words = rng.integers(0, 2**31, size=777, dtype=np.uint32)
    add = int(rng.integers(1, 1000))
    np.testing.assert_array_equal(runner.run("addp", words, params=[add]), words + np.uint32(add))
    np.testing.assert_array_equal(
        runner.run("addp", words, params=np.array([add, 0, 0, 0], dtype=np.uint32), entry_point="sub"),
        words - np.uint32(add),
    )
    # Workgroups override the dispatch rule: one group of 64 covers 64 words only.
    partial = runner.run("addp", words, params=[add], workgroups=(1, 1, 1))
    np.testing.assert_array_equal(partial[:64], words[:64] + np.uint32(add))
    assert not partial[64:].any()
    assert runner.timings.run > 0


def test_image_kernel_through_api(rng):
    w, h = 33, 17
    image = rng.integers(0, 256, size=(h, w, 4), dtype=np.uint8)
    out = api.run("pixelize", image, params=[w, h, 4, 0])
    np.testing.assert_array_equal(out.reshape(h, w, 4), reference.pixelize(image, 4))


@pytest.mark.parametrize(
    "kernel, kwargs, reason",
    [
        ("no_such_kernel", {}, "kernel_not_found"),
        ("double", {"params": [1]}, "bad_args"),
        ("glitch", {}, "bad_args"),
        ("double", {"entry_point": "nope"}, "bad_kernel"),
        ("double", {"output_size": 1 << 40}, "too_large"),
        ("double", {"params": [1 << 32]}, "bad_args"),
    ],
)
def test_errors_carry_the_port_reasons(kernel, kwargs, reason):
    with pytest.raises(KemError) as err:
        api.run(kernel, b"\x01\x02\x03\x04", **kwargs)
    assert err.value.reason == reason


def test_output_not_a_whole_dtype_is_refused():
    with pytest.raises(KemError) as err:
        api.run("double", np.arange(3, dtype=np.uint32), output_size=6)
    assert err.value.reason == "bad_args"


def test_client_plain_replies():
    with start_port() as client:
        config = client.call_plain("config")
        assert config["verify"] == "strict" and isinstance(config["max_batch"], int)
        assert client.call_plain("ping") == "pong"
        assert json.loads(client.call_plain("adapter_info"))["name"]
    assert plain({b"k": [True, None, b"\xff"]}) == {"k": [True, None, b"\xff"]}


def test_the_api_admits_kernels_as_the_port_does(tmp_path, rng):
    """One road for the Python API and the kem command (issue 24): a kernel
    that crashes naga (3,000 nested parentheses: SIGSEGV in this very
    process before) or exhausts the compile worker is kernel_rejected;
    the Runner goes on serving, and packaged kernels never wake the worker."""
    from test_compile_guard import ATTACKS, TRIPLE

    runner = api.Runner(Config(kernel_dir=tmp_path, compile_timeout_s=4.0, compile_memory_mb=512))
    words = rng.integers(0, 2**32, size=513, dtype=np.uint32)
    np.testing.assert_array_equal(runner.run("double", words), words * np.uint32(2))
    assert runner.guard.describe()["adapter_leaks_workgroup_memory"] is None  # no worker started
    try:
        for name in ("parens", "private_array_const"):
            (tmp_path / f"{name}.wgsl").write_text(ATTACKS[name])
            for attempt in ("first", "remembered"):
                with pytest.raises(KemError) as err:
                    runner.run(tmp_path / f"{name}.wgsl", words)
                assert err.value.reason == "kernel_rejected", (attempt, err.value)
        (tmp_path / "triple.wgsl").write_text(TRIPLE)
        for size in (1, 1000, 65_537):
            words = rng.integers(0, 2**32, size=size, dtype=np.uint32)
            np.testing.assert_array_equal(runner.run(tmp_path / "triple.wgsl", words), words * np.uint32(3))
            np.testing.assert_array_equal(runner.run("double", words), words * np.uint32(2))
    finally:
        runner.close()
