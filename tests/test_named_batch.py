"""Calls by named buffers of one kernel, queued behind each other, run in
one submission (port/gpu_loop._gather, gpu/named/named_batch.py): each
answered with its own values (numpy), its own gas and its own errors, none
seeing another's bytes, through the real port on the real adapter."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import start_port
from test_named_buffers import KERNELS
from kem_port.client import PortError
from kem_port.wire import terms

AXPY = KERNELS["axpy"]  # wgpu-py style: the uniform at binding 0, y in place

# Sums input[0] words of `data` per invocation in a loop: metered (gas), and
# a small budget runs out for one call and not for its batch-mates.
LOOPSUM = """
@group(0) @binding(0) var<storage, read> data: array<u32>;
@group(0) @binding(1) var<storage, read> rounds: array<u32>;
@group(1) @binding(0) var<storage, read_write> sums: array<u32>;
@compute @workgroup_size(16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&sums)) { return; }
    var total = 0u;
    for (var k = 0u; k < rounds[0]; k++) { total += data[(i + k) % arrayLength(&data)]; }
    sums[i] = total;
}
"""


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("batch")
    (kernels / "axpy.wgsl").write_text(AXPY)
    (kernels / "loopsum.wgsl").write_text(LOOPSUM)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache")) as port:
        yield port


def _stat(port, name: str) -> int:
    return port.call("stats").get(terms.atom(name), 0)


def _queued_behind_a_busy_gpu(port, calls: list[tuple]) -> list:
    """Send every call while the GPU thread sleeps: they queue together."""
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), 600)
    pending = [port.call_async("run", *args) for args in calls]
    busy.result(30)
    return pending


def _axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> tuple:
    params = np.array([alpha], np.float32).tobytes() + np.array([len(x)], np.uint32).tobytes()
    buffers = {b"params": params, b"x": x.tobytes(), b"y": y.tobytes()}
    return b"axpy", buffers, {"grid": (len(x), 1, 1)}


def test_queued_calls_of_one_kernel_share_a_submission_each_with_its_own_values(port, rng):
    sizes = [1, 7, 64, 64, 64, 300, 1000, 4097]  # three of one shape: replicas of its kit
    cases = [(float(rng.standard_normal()), rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32))
             for n in sizes]
    port.call("run", *_axpy(*cases[0]))  # admitted and compiled before the batch
    batches, calls = _stat(port, "named_batches"), _stat(port, "named_calls")
    pending = _queued_behind_a_busy_gpu(port, [_axpy(*case) for case in cases])
    for (alpha, x, y), got in zip(cases, pending):
        out = np.frombuffer(terms.binary_bytes(got.result(60)[terms.Binary(b"y")]), np.float32)
        np.testing.assert_allclose(out, np.float32(alpha) * x + y, rtol=1e-6, atol=1e-6)
    assert _stat(port, "named_batches") >= batches + 1
    assert _stat(port, "named_calls") == calls + len(cases)


def test_a_batch_mate_that_runs_out_of_gas_fails_alone(port, rng):
    def call(n: int, rounds: int, gas: int | None) -> tuple:
        data = rng.integers(0, 2**20, n, dtype=np.uint32)
        opts = {"outputs": {b"sums": 4 * n}, "grid": (n, 1, 1)}
        if gas is not None:
            opts["gas_limit"] = gas
        return data, rounds, (b"loopsum", {b"data": data.tobytes(), b"rounds": np.array([rounds], np.uint32).tobytes()}, opts)

    port.call("run", *call(16, 1, None)[2])
    cases = [call(16, 5, None), call(33, 40, 10), call(16, 5, None), call(200, 3, None)]  # the second: 40 rounds, budget 10
    pending = _queued_behind_a_busy_gpu(port, [args for *_, args in cases])
    for i, ((data, rounds, _), got) in enumerate(zip(cases, pending)):
        if i == 1:
            with pytest.raises(PortError) as err:
                got.result(60)
            assert err.value.reason == "gas_exhausted"
            continue
        idx = (np.arange(len(data))[:, None] + np.arange(rounds)[None, :]) % len(data)
        want = data[idx].astype(np.uint64).sum(axis=1).astype(np.uint32)
        np.testing.assert_array_equal(np.frombuffer(terms.binary_bytes(got.result(60)[terms.Binary(b"sums")]), np.uint32), want)


def test_a_refused_call_in_a_batch_is_answered_and_the_others_run(port, rng):
    x = rng.standard_normal(64).astype(np.float32)
    good = _axpy(2.0, x, x)
    bad = (b"axpy", {b"params": bytes(8), b"x": x.tobytes()}, {"grid": (64, 1, 1)})  # y neither given nor sized
    pending = _queued_behind_a_busy_gpu(port, [good, bad, good])
    for i, got in enumerate(pending):
        if i == 1:
            with pytest.raises(PortError) as err:
                got.result(60)
            assert err.value.reason == "bad_args" and "'y'" in err.value.detail
        else:
            out = np.frombuffer(terms.binary_bytes(got.result(60)[terms.Binary(b"y")]), np.float32)
            np.testing.assert_allclose(out, 3 * x, rtol=1e-6, atol=1e-6)
