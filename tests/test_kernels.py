"""Every example kernel through the real port against numpy, on fresh inputs."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from conftest import sent, until_inline, wait_running
from kem_port.wire import terms
from kem_port.client import PortError


def params(*words: int) -> bytes:
    return np.array(words, dtype="<u4").tobytes()


def test_worked_example(port):
    assert port.call("execute_kernel", b"double", bytes([1, 3, 5, 7]), 1) == bytes([2, 6, 10, 14])


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 64, 1023, 4096, 65537, 1 << 20])
@pytest.mark.parametrize("hint", [1, 2, 3, 4])
def test_double_matches_numpy(port, rng, size, hint):
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    out = port.call("execute_kernel", b"double", data, hint)
    assert len(out) == size * hint
    assert out == reference.double(data, size * hint)


@pytest.mark.parametrize("w,h,p", [(1, 1, 1), (16, 16, 4), (37, 21, 5), (255, 3, 0), (640, 480, 8), (1700, 1650, 7)])
def test_pixelize_matches_numpy(port, rng, w, h, p):
    image = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    out = port.call("execute_kernel_with_params", b"pixelize", image.tobytes(), params(w, h, p, 0))
    got = np.frombuffer(out, dtype=np.uint8).reshape(h, w, 4)
    np.testing.assert_array_equal(got, reference.pixelize(image, p))


@pytest.mark.parametrize("w,h", [(1, 1), (33, 17), (500, 300), (1601, 1603)])
def test_glitch_matches_numpy(port, rng, w, h):
    image = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    seed, strength = int(rng.integers(0, 2**32)), int(rng.integers(0, 64))
    out = port.call("execute", b"glitch", image.tobytes(), {"params": params(w, h, seed, strength)})
    got = np.frombuffer(out, dtype=np.uint8).reshape(h, w, 4)
    np.testing.assert_array_equal(got, reference.glitch(image, seed, strength))


def test_glitch_changes_some_rows_and_keeps_green(port, rng):
    w, h = 64, 256
    image = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    out = np.frombuffer(
        port.call("execute_kernel_with_params", b"glitch", image.tobytes(), params(w, h, 7, 20)), dtype=np.uint8
    ).reshape(h, w, 4)
    np.testing.assert_array_equal(out[:, :, 1], image[:, :, 1])
    assert (out != image).any()


def test_execute_output_size_and_workgroups(port, rng):
    data = rng.integers(0, 256, 1000, dtype=np.uint8).tobytes()
    out = port.call("execute", b"double", data, {"output_size": 10})
    assert out == reference.double(data, 10)
    # Explicit workgroups covering only the first 256 words: the rest stays 0.
    out = port.call("execute", b"double", data, {"workgroups": (1, 1, 1)})
    assert out == reference.double(data, 1000)  # 250 words < 256: all covered
    big = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    part = port.call("execute", b"double", big, {"workgroups": (1, 1, 1)})
    assert part[:1024] == reference.double(big, 1024) and part[1024:] == bytes(3072)


def test_output_size_zero_is_empty(port):
    assert port.call("execute", b"double", b"abcd", {"output_size": 0}) == b""


def test_empty_input_binds_zero_word(port):
    assert port.call("execute", b"double", b"", {"output_size": 8}) == bytes(8)


SPILL_KERNEL = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = wid.x + wid.y * n.x;
    if (i < arrayLength(&dst)) { dst[i] = src[i] + 1u; }
}
"""

NO_SPILL_KERNEL = SPILL_KERNEL.replace(", @builtin(num_workgroups) n: vec3<u32>", "").replace(
    "wid.x + wid.y * n.x", "wid.x"
)


def test_y_spill_covers_every_element(kernel_dir, rng):
    from conftest import start_port

    (kernel_dir / "spill.wgsl").write_text(SPILL_KERNEL)
    (kernel_dir / "nospill.wgsl").write_text(NO_SPILL_KERNEL)
    words = rng.integers(0, 2**32 - 1, 65535 * 2 + 17, dtype=np.uint32)  # needs 3 rows of groups
    with start_port(KEM_KERNEL_DIR=str(kernel_dir)) as port:
        out = np.frombuffer(port.call("execute_kernel", b"spill", words.tobytes(), 1), dtype="<u4")
        np.testing.assert_array_equal(out, words + 1)
        with pytest.raises(PortError) as err:
            port.call("execute_kernel", b"nospill", words.tobytes(), 1)
        assert err.value.reason == "dispatch_too_large"
        small = words[:1000]
        out = np.frombuffer(port.call("execute_kernel", b"nospill", small.tobytes(), 1), dtype="<u4")
        np.testing.assert_array_equal(out, small + 1)


def test_output_is_cleared_between_callers(port, rng):
    """A pooled output buffer must not leak a previous caller's bytes."""
    secret = rng.integers(1, 256, 4096, dtype=np.uint8).tobytes()
    port.call("execute_kernel", b"double", secret, 1)
    part = port.call("execute", b"double", bytes(4096), {"workgroups": (1, 1, 1)})
    assert part == bytes(4096)


def test_mixed_batches(port, rng):
    """Calls queued together share one batch: packed small inputs, large
    ones uploaded apart, params, and three pipelines in one compute pass."""
    from concurrent.futures import wait

    port.call_async("test_hook", __import__("kem_port.wire.terms", fromlist=["atom"]).atom("sleep_gpu"), 300)
    expected, futures = [], []
    for i in range(30):
        kind = i % 3
        if kind == 0:
            data = rng.integers(0, 256, int(rng.choice([3, 1000, 300_000, 1 << 20])), dtype=np.uint8).tobytes()
            futures.append(port.call_async("execute_kernel", b"double", data, 2))
            expected.append(reference.double(data, 2 * len(data)))
        elif kind == 1:
            w, h, p = int(rng.integers(1, 90)), int(rng.integers(1, 90)), int(rng.integers(1, 9))
            image = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
            futures.append(port.call_async("execute_kernel_with_params", b"pixelize", image.tobytes(), params(w, h, p, 0)))
            expected.append(reference.pixelize(image, p).tobytes())
        else:
            w, h = int(rng.integers(1, 90)), int(rng.integers(1, 90))
            seed, strength = int(rng.integers(0, 2**32)), int(rng.integers(0, 30))
            image = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
            futures.append(port.call_async("execute", b"glitch", image.tobytes(), {"params": params(w, h, seed, strength)}))
            expected.append(reference.glitch(image, seed, strength).tobytes())
    wait(futures, timeout=120)
    for want, fut in zip(expected, futures):
        assert fut.result() == want


def test_lone_calls_run_on_the_reader_and_a_backlog_still_batches(port, rng):
    """An idle port runs a lone small call on its reader thread (no hand-off
    to the GPU thread); calls that arrive while the GPU is busy queue and
    share batches. Both roads give numpy's answer."""
    from concurrent.futures import wait

    def stat(name: str) -> int:
        return port.call("stats")[terms.atom(name)]

    data = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    assert port.call("execute_kernel", b"double", data, 1) == reference.double(data, 64)
    until_inline(port, "inline_calls", lambda: port.call("execute_kernel", b"double", data, 2))
    inline_before = stat("inline_calls")
    for _ in range(10):
        data = rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes()
        assert port.call("execute_kernel", b"double", data, 2) == reference.double(data, 2 * len(data))
    assert stat("inline_calls") - inline_before == 10

    shared_before = stat("batched_calls") - stat("batches")
    hold_id, _ = sent(port, "test_hook", terms.atom("sleep_gpu"), 1000)
    wait_running(port, hold_id)  # the 40 calls queue behind it, whatever the load
    inputs = [rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes() for _ in range(40)]
    futures = [port.call_async("execute_kernel", b"double", d, 1) for d in inputs]
    wait(futures, timeout=60)
    assert [f.result() for f in futures] == [reference.double(d, len(d)) for d in inputs]
    assert stat("batched_calls") - stat("batches") > shared_before
