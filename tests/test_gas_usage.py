"""Gas in the usage record (issue 27, docs/metering.md), at the port: a
call with ``usage => true`` is answered ``{Result, #{gas => G}}`` on every
road it may take (the batch road, the reader's lone road and its kit, a
shared-memory result), G the count worked by hand; a call without it is
answered as before; a loop-free call's own ``gas_limit`` below what it
launches is gas_exhausted before it runs. Erlang's side:
erlang/kem/test/kem_gas_usage_tests.erl.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import start_port
from kem_port.client import PortError, plain
from kem_port.wire import terms

COUNTING = (Path(__file__).resolve().parents[1] / "tests" / "gas_kernels" / "counting.wgsl").read_bytes()  # one text for pytest and eunit
AFFINE = b"""
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= arrayLength(&out)) { return; }
  out[g.x] = 3u * inp[g.x] + 1u;
}
"""


def launched(words: int) -> int:
    return (words + 63) // 64 * 64


@pytest.fixture(scope="module")
def shm_dir(tmp_path_factory):
    shm = tmp_path_factory.mktemp("gas_usage_shm") / "shm"
    shm.mkdir(mode=0o700)  # private, as kem_shm_dir makes it (tests/test_shm.py)
    return shm


@pytest.fixture(scope="module")
def port(tmp_path_factory, shm_dir):
    kernels = tmp_path_factory.mktemp("gas_usage")
    (kernels / "counting.wgsl").write_bytes(COUNTING)
    (kernels / "affine.wgsl").write_bytes(AFFINE)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_SHM_DIR=str(shm_dir)) as client:
        yield client


def with_usage(port, kernel: bytes, data: np.ndarray, **opts) -> tuple[bytes, int]:
    result, usage = port.call("execute", kernel, data.tobytes(), {"usage": True, **opts})
    return terms.binary_bytes(result), plain(usage)["gas"]


@pytest.mark.parametrize("words", [1, 64, 100, 5000])
def test_a_looping_call_answers_its_hand_counted_gas(port, rng, words):
    data = rng.integers(0, 40, words, dtype=np.uint32)
    out, gas = with_usage(port, b"counting", data)
    assert out == (data * (data.astype(np.int64) - 1) // 2).astype(np.uint32).tobytes()
    assert gas == launched(words) + int(data.sum())


@pytest.mark.parametrize("words", [1, 100, 4096, 300_000])
def test_a_loop_free_call_answers_its_invocations_on_every_road(port, rng, words):
    data = rng.integers(0, 2**20, words, dtype=np.uint32)
    want = (3 * data + 1).astype(np.uint32).tobytes()
    for _ in range(2):  # the first call compiles (batch road); the next may take the reader's kit
        out, gas = with_usage(port, b"affine", data)
        assert (out, gas) == (want, launched(words))
    assert port.call("execute", b"affine", data.tobytes(), {}) == want  # without usage: the bare result


def test_a_shared_memory_result_has_its_gas_beside_it(port, rng, shm_dir):
    """As Erlang's kem_shm sends a large call: the input and the result in
    files; the reply names the result's file and size, its gas beside."""
    data = rng.integers(0, 2**20, 300_000, dtype=np.uint32)
    (shm_dir / "1.in").write_bytes(data.tobytes())
    reply = port.call("execute", b"affine", (terms.atom("shm"), str(shm_dir / "1.in").encode()),
                      {"usage": True, "output_shm": str(shm_dir / "1.out").encode()})
    (name, _path, size), usage = plain(reply)
    assert (name, size, usage["gas"]) == ("shm", data.nbytes, launched(300_000))
    assert (shm_dir / "1.out").read_bytes() == (3 * data + 1).astype(np.uint32).tobytes()


def test_a_loop_free_calls_own_limit_counts_what_it_launches(port, rng):
    data = rng.integers(0, 2**20, 100, dtype=np.uint32)
    with pytest.raises(PortError) as caught:
        port.call("execute", b"affine", data.tobytes(), {"gas_limit": 127})
    assert caught.value.reason == "gas_exhausted" and "limit 127" in caught.value.detail
    assert with_usage(port, b"affine", data, gas_limit=128)[1] == 128


def test_usage_must_be_a_boolean(port):
    with pytest.raises(PortError) as caught:
        port.call("execute", b"affine", bytes(4), {"usage": 1})
    assert caught.value.reason == "bad_args" and "usage" in caught.value.detail


# -- the Python API and the CLI (docs/python.md, docs/cli.md) -------------------


@pytest.fixture(scope="module")
def runner():
    from kem_port.api.runner import Runner

    made = Runner()
    yield made
    made.close()


@pytest.mark.parametrize("words", [64, 1000])
def test_the_api_answers_each_calls_gas_and_takes_a_limit(tmp_path, rng, runner, words):
    from kem_port import api

    (tmp_path / "counting.wgsl").write_bytes(COUNTING)
    kernel = str(tmp_path / "counting.wgsl")
    data = rng.integers(0, 30, words, dtype=np.uint32)
    want = (data * (data.astype(np.int64) - 1) // 2).astype(np.uint32)
    np.testing.assert_array_equal(api.run(kernel, data, runner=runner), want)
    assert runner.gas == launched(words) + int(data.sum())
    enough = launched(words) * (1 + int(data.max()))  # shared evenly: each may loop as the busiest does
    np.testing.assert_array_equal(api.run(kernel, data, runner=runner, gas_limit=enough), want)
    with pytest.raises(PortError) as caught:
        api.run(kernel, data, runner=runner, gas_limit=enough - 1)
    assert caught.value.reason == "gas_exhausted"
    (tmp_path / "affine.wgsl").write_bytes(AFFINE)
    api.run(str(tmp_path / "affine.wgsl"), data, runner=runner)
    assert runner.gas == launched(words)  # no loop: what it launched


def test_run_debug_answers_gas(tmp_path, rng, runner):
    from kem_port import api

    path = tmp_path / "counting.wgsl"
    path.write_bytes(COUNTING)
    data = rng.integers(0, 30, 100, dtype=np.uint32)
    assert api.run_debug(str(path), data, runner=runner).gas == launched(100) + int(data.sum())


def test_kem_run_takes_a_gas_limit_and_prints_gas(tmp_path):
    from cli_helpers import kem

    (tmp_path / "counting.wgsl").write_bytes(COUNTING)
    (tmp_path / "in.bin").write_bytes(np.full(64, 10, np.uint32).tobytes())
    run = ("run", str(tmp_path / "counting.wgsl"), "--input", str(tmp_path / "in.bin"), "-o", str(tmp_path / "out.bin"))
    done = kem(tmp_path, "-v", *run, "--gas-limit", "704")
    assert done.returncode == 0, done.stderr
    assert "gas: 704" in done.stderr.decode()
    assert (tmp_path / "out.bin").read_bytes() == np.full(64, 45, np.uint32).tobytes()
    done = kem(tmp_path, *run, "--gas-limit", "703")
    assert done.returncode != 0 and "gas_exhausted" in done.stderr.decode()
    for bad in ("0", "-3", "lots", str(1 << 63)):
        done = kem(tmp_path, *run, "--gas-limit", bad)
        assert done.returncode == 2 and "gas limit" in done.stderr.decode(), bad


@pytest.mark.parametrize("gas", [0, 255, 256, 704, 2**31, 2**40, 2**63 - 1])
def test_the_usage_reply_is_the_librarys_encoding(rng, gas):
    """wire/terms.ok_gas_reply splices its envelope by hand: it must be the
    bytes erlang-py makes of the same term, for any ReqId and payload."""
    for req_id in (0, 7, 300, 2**31, 2**64 - 1):
        payload = rng.bytes(int(rng.integers(0, 5000)))
        want = terms.encode((terms.atom("reply"), req_id,
                             (terms.atom("ok"), (terms.Binary(payload), {terms.atom("gas"): gas}))))
        assert b"".join(bytes(p) for p in terms.ok_gas_reply(req_id, memoryview(payload), gas)) == want


def test_a_usage_execute_kernel_keeps_the_hot_road(port, rng):
    """kem_usage asks dev_kem's calls as {KernelId, Input, Hint, usage}: the
    narrow reader takes it (a hot request, usage on its call) and the port
    answers its gas, 'hot' or not; the bare three-tuple is answered as before."""
    from kem_port.config import Config
    from kem_port.wire.request_fast import hot_execute_kernel

    data = rng.integers(0, 2**20, 1000, dtype=np.uint32)
    usage = terms.atom("usage")
    frame = terms.encode((terms.atom("call"), 9, terms.atom("execute_kernel"),
                          (terms.Binary(b"affine"), terms.Binary(data.tobytes()), 1, usage), 5000))
    request = hot_execute_kernel(frame, Config())
    assert request is not None and request.hot and request.call.usage and request.call.output_size == data.nbytes
    plain_frame = terms.encode((terms.atom("call"), 9, terms.atom("execute_kernel"),
                                (terms.Binary(b"affine"), terms.Binary(data.tobytes()), 1), 5000))
    assert hot_execute_kernel(plain_frame, Config()).call.usage is False
    want = (3 * data + 1).astype(np.uint32).tobytes()
    for _ in range(3):  # compiled, then the reader's kit (run_known)
        result, gas = port.call("execute_kernel", b"affine", data.tobytes(), 1, usage)
        assert (terms.binary_bytes(result), plain(gas)) == (want, {"gas": launched(1000)})
    assert port.call("execute_kernel", b"affine", data.tobytes(), 1) == want
    with pytest.raises(PortError) as caught:
        port.call("execute_kernel", b"affine", data.tobytes(), 1, terms.atom("other"))
    assert caught.value.reason == "bad_args"
