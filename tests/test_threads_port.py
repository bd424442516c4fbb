"""Many callers at once through the real port on the real adapter: every
road the port's threads share (the reader's lone road and inline named
calls and session work, the GPU thread's batches, gathered named calls and
chains, the fetch threads' admissions, quick methods answered on the
reader meanwhile), each answer checked against numpy, none ``internal``.

Each caller has its own session and its own inputs, so an answer with
another caller's bytes (a kit or replica used by two calls at once) fails
its comparison; the budget is back to zero once every call is answered.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import start_port

from kem_port.client import PortError
from kem_port.wire import terms
from test_named_buffers import KERNELS

CALLERS = 12
ROUNDS = 12
FRESH = 96  # copies of axpy, each its own kernel: more than NamedRuns keeps shapes of (named_pipelines.PIPELINES, 64)
SESSION_KERNELS = Path(__file__).resolve().parent / "session_kernels"


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("threads")
    (kernels / "axpy.wgsl").write_text(KERNELS["axpy"])
    for i in range(FRESH):  # admitted on a fetch thread at its first call, beside the reader's inline ones
        (kernels / f"axpy_{i}.wgsl").write_text(f"// copy {i}\n" + KERNELS["axpy"])
    (kernels / "accumulate.wgsl").write_text((SESSION_KERNELS / "accumulate.wgsl").read_text())
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache")) as client:
        yield client


def _bytes(value) -> bytes:
    return value if isinstance(value, bytes) else terms.binary_bytes(value)


def _double(port, rng) -> None:
    x = rng.integers(0, 2**32, int(rng.choice([1, 3, 64, 1000, 16384])), dtype=np.uint32)
    got = np.frombuffer(port.call("execute_kernel", b"double", x.tobytes(), 1), "<u4")
    assert np.array_equal(got, x * np.uint32(2))


def _axpy(port, rng, kernel: bytes = b"axpy") -> None:
    n = int(rng.choice([1, 7, 64, 300, 4097]))
    alpha = np.float32(rng.standard_normal())
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    params = np.array([alpha], np.float32).tobytes() + np.array([n], np.uint32).tobytes()
    got = port.call("run", kernel, {b"params": params, b"x": x.tobytes(), b"y": y.tobytes()}, {"grid": (n, 1, 1)})
    np.testing.assert_allclose(np.frombuffer(_bytes(got[terms.Binary(b"y")]), np.float32), alpha * x + y, rtol=1e-6, atol=1e-6)


_NEXT_FRESH = itertools.count()  # each caller's next fresh kernel: all FRESH are met, then again


def _fresh(port, rng) -> None:
    _axpy(port, rng, f"axpy_{next(_NEXT_FRESH) % FRESH}".encode())


def _chain(port, rng) -> None:
    x = rng.integers(0, 2**32, int(rng.choice([1, 100, 1024])), dtype=np.uint32)
    got = port.chain([{"kernel": "double"}] * 3, input=x.tobytes())
    assert np.array_equal(np.frombuffer(_bytes(got), "<u4"), x * np.uint32(8))


def _group(port, rng) -> None:
    inputs = [rng.integers(0, 2**32, 16, dtype=np.uint32) for _ in range(int(rng.integers(2, 9)))]
    for x, got in zip(inputs, port.call_group_async(b"double", [x.tobytes() for x in inputs])):
        assert np.array_equal(np.frombuffer(_bytes(got.result(60)), "<u4"), x * np.uint32(2))


def _calls_frame(port, rng) -> None:
    """Several requests in one calls frame (the node's batching), read together on the reader."""
    xs = [rng.integers(0, 2**32, int(rng.choice([1, 64, 1000])), dtype=np.uint32) for _ in range(4)]
    calls = [("execute_kernel", b"double", x.tobytes(), 1) for x in xs[:3]] + [("chain", terms.atom("undefined"), [{"kernel": "double"}] * 2, {"input": xs[3].tobytes()}), ("ping",)]
    *doubled, chained, pong = port.call_batch_async(calls)
    for x, got in zip(xs, doubled):
        assert np.array_equal(np.frombuffer(_bytes(got.result(60)), "<u4"), x * np.uint32(2))
    assert np.array_equal(np.frombuffer(_bytes(chained.result(60)), "<u4"), xs[3] * np.uint32(4))
    assert terms.atom_name(pong.result(60)) == "pong"


def _quick(port, rng) -> None:
    assert terms.atom_name(port.call("ping")) == "pong"
    assert isinstance(port.call("stats"), dict)
    assert port.call_plain("call_state", int(rng.integers(1, 2**31)))["state"] == "unknown"


ROADS = (_double, _axpy, _fresh, _chain, _group, _calls_frame, _quick)


def _caller(port, seed: int, failures: list) -> None:
    rng = np.random.default_rng(seed)
    try:
        session = port.session_open()
        words = int(rng.choice([16, 256, 4096]))
        session.create("acc", 4 * words)
        acc = np.zeros(words, np.uint32)
        for _ in range(ROUNDS):
            for road in rng.permutation(len(ROADS)):
                ROADS[road](port, rng)
            step = rng.integers(0, 2**20, words, dtype=np.uint32)
            session.call("accumulate", step.tobytes(), output_size=0)
            acc += step
            assert np.array_equal(np.frombuffer(session.read("acc"), "<u4"), acc)  # its own session's bytes only
        session.close()
    except Exception as exc:  # noqa: BLE001  (an assertion or the port's refusal: both reported)
        failures.append(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("callers", [2, CALLERS])  # 2: the reader's inline roads beside the other's work; 12: queues
def test_many_callers_on_every_road_each_get_their_own_values(port, rng, callers):
    # Compiled and admitted once first, so the callers also meet the inline roads.
    for road in ROADS:
        road(port, rng)
    errors_before = port.call_plain("stats")["errors"]
    failures: list[str] = []
    seeds = rng.integers(0, 2**63, callers)
    threads = [threading.Thread(target=_caller, args=(port, int(seed), failures)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert failures == []
    stats = port.call_plain("stats")
    assert stats["errors"] == errors_before  # no refusal of any kind
    assert (stats["held_calls"], stats["held_bytes"]) == (0, 0)  # every share given back, once


LOST_REASONS = {"device_lost", "gpu_error", "no_adapter"}  # what a call in flight when the device goes may hear


def _stateless_caller(port, seed: int, stop: threading.Event, failures: list, lost: list) -> None:
    rng = np.random.default_rng(seed)
    roads = (_double, _axpy, _chain, _group, _calls_frame, _quick)
    while not stop.is_set():
        try:
            roads[int(rng.integers(len(roads)))](port, rng)
        except PortError as exc:
            (lost if exc.reason in LOST_REASONS else failures).append(f"{exc.reason}: {exc.detail}")
        except Exception as exc:  # noqa: BLE001  (a wrong value, or a reply of another shape)
            failures.append(f"{type(exc).__name__}: {exc}")


def test_callers_on_every_road_while_the_device_is_lost_and_rebuilt(port, rng):
    """The device destroyed three times under load (test_hook destroy_device,
    a control action on the GPU thread): callers on the reader's inline
    roads and the GPU thread's batches at once hear their values or a
    device's failure, never internal or another caller's bytes; the
    budget comes back whole and the port answers after."""
    for road in ROADS:
        road(port, rng)
    stop, failures, lost = threading.Event(), [], []
    threads = [threading.Thread(target=_stateless_caller, args=(port, int(seed), stop, failures, lost))
               for seed in rng.integers(0, 2**63, 8)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(3):
            time.sleep(1.0)
            assert terms.atom_name(port.call("test_hook", terms.atom("destroy_device"))) == "ok"
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert failures == []
    for road in ROADS:  # the rebuilt device serves every road
        road(port, rng)
    stats = port.call_plain("stats")
    assert stats["device_rebuilds"] >= 1
    assert (stats["held_calls"], stats["held_bytes"]) == (0, 0)
