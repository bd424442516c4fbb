"""Red team 4: the chain option max_bytes, gathered stateless chains and the
playground's token, attacked through the real port and a real server."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
from conftest import playground_server, session_port
from test_chain_batch import TEN, _bytes

from kem_port.client import PortError
from kem_port.wire import terms

UNDEF = terms.atom("undefined")


@pytest.fixture(scope="module")
def port():
    with session_port() as client:
        yield client


def _u32(value) -> np.ndarray:
    return np.frombuffer(_bytes(value), "<u4")


@pytest.mark.parametrize("bad", [-1, -(2**200), True, False, 1.5, terms.atom("infinity"), b"100"])
def test_a_bad_max_bytes_is_refused_as_bad_args(port, bad):
    with pytest.raises(PortError) as err:
        port.call("chain", UNDEF, TEN, {"input": bytes(64), "max_bytes": bad})
    assert err.value.reason in ("bad_args", "too_large")  # a bignum is refused by the decoder


def test_a_huge_max_bytes_is_the_ports_own_budget(port, rng):
    """Up to the decoder's 8-byte integers a budget over the port's is the
    port's; a bignum (2**200) is refused by the decoder, never planned with."""
    for limit in (2**63 - 1, 2**64 - 1):
        x = rng.integers(0, 2**32, 100, dtype=np.uint32)
        got = port.call("chain", UNDEF, TEN, {"input": x.tobytes(), "max_bytes": limit})
        assert np.array_equal(_u32(got), x * np.uint32(1024))
    with pytest.raises(PortError) as err:
        port.call("chain", UNDEF, TEN, {"input": bytes(64), "max_bytes": 2**200})
    assert err.value.reason == "too_large"


def test_max_bytes_zero_refuses_any_output(port):
    with pytest.raises(PortError) as err:
        port.call("chain", UNDEF, TEN, {"input": bytes(64), "max_bytes": 0})
    print("max_bytes=0:", err.value.reason, err.value.detail)
    assert err.value.reason in ("bad_args", "quota_exceeded", "too_large")


def test_a_kit_built_under_a_big_budget_is_not_reused_under_a_small_one(port, rng):
    """A shape kept with a big max_bytes, then the same shape with a budget
    under its output: refused, not run on the kept kit."""
    n = 256  # 1024 bytes of output
    for _ in range(3):
        x = rng.integers(0, 2**32, n, dtype=np.uint32)
        got = port.call("chain", UNDEF, TEN, {"input": x.tobytes(), "max_bytes": 1 << 20})
        assert np.array_equal(_u32(got), x * np.uint32(1024))
    with pytest.raises(PortError) as err:
        port.call("chain", UNDEF, TEN, {"input": bytes(4 * n), "max_bytes": 16})
    print("kit reuse:", err.value.reason, err.value.detail)
    assert err.value.reason != "internal"
    # and queued together behind a busy GPU, the small one still refused alone
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), 400)
    xs = [rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(3)]
    limits = [1 << 20, 16, 1 << 20]
    pending = [port.call_async("chain", UNDEF, TEN, {"input": x.tobytes(), "max_bytes": m}) for x, m in zip(xs, limits)]
    busy.result(30)
    with pytest.raises(PortError):
        pending[1].result(60)
    for i in (0, 2):
        assert np.array_equal(_u32(pending[i].result(60)), xs[i] * np.uint32(1024))


def test_gathered_chains_mixed_usage_returns_and_errors_each_get_their_own(port, rng):
    steps = [{"kernel": "double", "output": "a"}, {"kernel": "double", "input": "a", "output": "b"}]
    shapes = [
        ({"return": ["a", "b"], "usage": True}, "ab", True),
        ({"return": ["b"]}, "b", False),
        ({}, None, False),
        ({"usage": True}, None, True),
    ]
    n = 64
    for opts, _, _ in shapes:  # each shape planned, then kept
        for _ in range(2):
            port.call("chain", UNDEF, steps, {"input": bytes(4 * n), **opts})
    calls, expect = [], []
    for opts, names, usage in shapes:  # runs of one shape gather; a bad chain between them
        for _ in range(4):
            x = rng.integers(0, 2**32, n, dtype=np.uint32)
            calls.append((steps, {"input": x.tobytes(), **opts}))
            expect.append((x, names, usage, False))
        calls.append((steps, {"input": bytes(12), "return": ["nope"]}))
        expect.append((None, None, False, True))
    batches = port.call("stats").get(terms.atom("chain_batches"), 0)
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), 600)
    pending = [port.call_async("chain", UNDEF, s, o) for s, o in calls]
    busy.result(30)
    for (x, names, usage, bad), got in zip(expect, pending):
        if bad:
            with pytest.raises(PortError) as err:
                got.result(60)
            assert err.value.reason != "internal"
            continue
        value = got.result(60)
        if usage:
            value, meter = value
            assert meter[terms.atom("gas")] == 2 * 256
        if names is None:
            assert np.array_equal(_u32(value), x * np.uint32(4))
        else:
            named = {_bytes(k).decode(): _u32(v) for k, v in value.items()}
            assert set(named) == set(names)
            if "a" in named:
                assert np.array_equal(named["a"], x * np.uint32(2))
            assert np.array_equal(named["b"], x * np.uint32(4))
    assert port.call("stats").get(terms.atom("chain_batches"), 0) >= batches + 4  # runs of one shape were gathered


@pytest.fixture(scope="module")
def playground():
    with playground_server() as srv:
        yield srv


def _ask(server, path: str, headers: list[tuple[str, str]]) -> int:
    """A GET with raw header lines (duplicates kept, bytes as given)."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    conn.putrequest("GET", path, skip_accept_encoding=True)
    for name, value in headers:
        conn.putheader(name, value.encode("utf-8") if isinstance(value, str) else value)
    conn.endheaders()
    response = conn.getresponse()
    status = response.status
    body = response.read()
    if status != 200:
        assert json.loads(body)["error"]["reason"] in ("forbidden", "bad_args")
        assert server.token.encode() not in body
    return status


def test_token_tricks_are_refused(playground):
    t = playground.token
    c = "kem_playground_token="
    refused = [
        ("/?token=wrong&token=" + t, []),
        ("/?token=" + t[:-1], []),
        ("/?token=" + t + "x", []),
        ("/?token=" + "A" * 100000, []),
        ("/?token=%C3%A9" + t, []),
        ("/?token=%FF%FE", []),
        ("/?tok%65n=" + t[:-1], []),
        ("/", [("Cookie", c + "wrong"), ("Cookie", c + "bad")]),
        ("/", [("X-Kem-Token", "é" * 40)]),
        ("/", [("X-Kem-Token", "x" * 60000)]),
        ("/", [("Cookie", c + "\u00e9" + t)]),
        ("/?token=", [("X-Kem-Token", "")]),
        ("/;token=" + t, []),
    ]
    for path, headers in refused:
        assert _ask(playground, path, headers) in (400, 403, 414, 431), (path[:60], headers[:1])
    assert _ask(playground, "/?token=" + t, []) == 200
    assert _ask(playground, "/?x=1&token=" + t, []) == 200
    assert _ask(playground, "/", [("X-Kem-Token", t)]) == 200


def test_more_queued_chains_than_kept_replicas_each_get_their_own(port, rng):
    """70 chains of one shape queued together: over REPLICAS (64) extra kits,
    the rest run alone; every caller still gets its own numpy answer."""
    n = 16
    for _ in range(2):
        port.call("chain", UNDEF, TEN, {"input": bytes(4 * n)})
    xs = [rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(70)]
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), 600)
    pending = [port.call_async("chain", UNDEF, TEN, {"input": x.tobytes()}) for x in xs]
    busy.result(30)
    for x, got in zip(xs, pending):
        assert np.array_equal(_u32(got.result(120)), x * np.uint32(1024))


def test_gathered_chains_take_each_callers_step_bytes_not_the_first_chains(port, rng):
    """Named-buffer steps carry the caller's bytes in the step itself (a, b,
    the shape uniform): a replica planned from the shape's first chain must
    still upload each caller's own step bytes."""
    rows, cols = 5, 7

    def steps(a: np.ndarray, b: np.ndarray) -> list:
        shape = np.array([rows, cols], "<u4").tobytes()
        return [{"kernel": "add_grid", "buffers": {"a": a.tobytes(), "b": b.tobytes(), "shape": shape},
                 "outputs": {"c": rows * cols * 4}, "grid": (cols, rows, 1)}]

    def pair() -> tuple[np.ndarray, np.ndarray]:
        return rng.integers(0, 2**31, rows * cols, dtype=np.uint32), rng.integers(0, 2**31, rows * cols, dtype=np.uint32)

    for _ in range(2):
        a, b = pair()
        got = port.call("chain", UNDEF, steps(a, b), {"return": ["c"]})
        assert np.array_equal(_u32(got[terms.Binary(b"c")]), a + b)
    batches = port.call("stats").get(terms.atom("chain_batches"), 0)
    pairs = [pair() for _ in range(6)]
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), 500)
    pending = [port.call_async("chain", UNDEF, steps(a, b), {"return": ["c"]}) for a, b in pairs]
    busy.result(30)
    for (a, b), got in zip(pairs, pending):
        assert np.array_equal(_u32(got.result(60)[terms.Binary(b"c")]), a + b)
    assert port.call("stats").get(terms.atom("chain_batches"), 0) >= batches + 1


def test_max_bytes_is_exact_at_its_edge_and_holds_for_a_sessions_kept_kit(port, rng):
    """Ten steps of 1024 bytes hold 10240 bytes of chain buffers: that budget
    runs (numpy), one byte less is refused, also after a kit was kept."""
    for limit in (10240, 10240, 10240, 10239):
        x = rng.integers(0, 2**32, 256, dtype=np.uint32)
        if limit == 10239:
            with pytest.raises(PortError) as err:
                port.call("chain", UNDEF, TEN, {"input": x.tobytes(), "max_bytes": limit})
            assert err.value.reason == "too_large" and "10239" in err.value.detail
        else:
            got = port.call("chain", UNDEF, TEN, {"input": x.tobytes(), "max_bytes": limit})
            assert np.array_equal(_u32(got), x * np.uint32(1024))
    s = port.session_open()
    s.create("acc", bytes(1024))
    steps = [{"kernel": "double", "output": "acc"}]
    for _ in range(3):  # kept under a big budget
        x = rng.integers(0, 2**32, 256, dtype=np.uint32)
        got = port.call("chain", s.ref, steps, {"input": x.tobytes(), "return": ["acc"], "max_bytes": 1 << 20})
        assert np.array_equal(_u32(got[terms.Binary(b"acc")]), x * np.uint32(2))
    with pytest.raises(PortError) as err:
        port.call("chain", s.ref, steps, {"input": bytes(1024), "return": ["acc"], "max_bytes": 16})
    assert err.value.reason == "too_large"
    s.close()


def test_more_token_tricks_on_post_and_headers(playground):
    t = playground.token
    for path, headers in (("/?token=%20" + t, []), ("/?token=" + t.upper() if t != t.upper() else "/?token=" + t.lower(), []),
                          ("/", [("Cookie", "x=1"), ("Cookie", "kem_playground_token=" + t)]),  # only the first Cookie header counts
                          ("/", [("X-Kem-Token", t + "\u0000")])):
        assert _ask(playground, path, headers) in (400, 403), path[:40]
    assert _ask(playground, "/", [("x-kem-token", t)]) == 200  # header names are case-blind
    conn = http.client.HTTPConnection(*playground.server_address[:2], timeout=60)
    conn.request("POST", "/api/check?token=" + t, body=b"{}", headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 404 and t.encode() not in response.read()  # POST routes take no query


@pytest.mark.parametrize("out, limit", [(2**40, None), (2**40, 64), (2**33, None), (4 * 10**8, 2**62)])
def test_a_huge_declared_output_is_refused_before_allocation_whatever_max_bytes(port, out, limit):
    shape = np.array([1, 1], "<u4").tobytes()
    steps = [{"kernel": "add_grid", "buffers": {"a": bytes(4), "b": bytes(4), "shape": shape},
              "outputs": {"c": out}, "grid": (1, 1, 1)}]
    opts = {"return": ["c"]} | ({} if limit is None else {"max_bytes": limit})
    with pytest.raises(PortError) as err:
        port.call("chain", UNDEF, steps, opts)
    assert err.value.reason == "too_large"
    assert port.call("ping") is not None  # the port is still up
