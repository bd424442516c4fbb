"""Hostile gateways (issue 13, item 6 and Build 7-8), against real HTTP
servers on 127.0.0.1: a trickling gateway is cut off and the next one
tried, slow fetches do not hold up other kernels, junk headers are that
gateway's failure, ids are matched whole, and errors name gateways by
number, never by URL."""

from __future__ import annotations

import json
import time
from concurrent.futures import wait

import pytest

import reference
from arweave_fixture import Gateway, Route, make_tx, new_key
from conftest import start_port
from kem_port.arweave.gateway import header_int
from kem_port.arweave.ids import BadEncoding, b64url_decode, b64url_encode, is_arweave_id
from kem_port.client import PortError
from kem_port.kernel_store import PACKAGED_KERNELS

DOUBLE = (PACKAGED_KERNELS / "double.wgsl").read_bytes()


@pytest.fixture(scope="module")
def key():
    return new_key()


@pytest.fixture
def gateways():
    pair = (Gateway(), Gateway())
    yield pair
    for gw in pair:
        gw.close()


def port_for(tmp_path, *gws, **env):
    settings = {"KEM_GATEWAYS": ",".join(g.url for g in gws), "KEM_CACHE_DIR": str(tmp_path / "cache"),
                "KEM_FETCH_TIMEOUT_MS": "1500", "KEM_FETCH_RETRIES": "0"}
    return start_port(**{**settings, **env})


def double_ok(port, kernel_id: str, rng) -> None:
    data = rng.integers(0, 256, int(rng.integers(1, 3000)), dtype="uint8").tobytes()
    assert port.call("execute_kernel", kernel_id.encode(), data, 2, timeout=60) == reference.double(data, 2 * len(data))


def test_a_trickling_gateway_is_cut_off_and_the_next_one_serves(tmp_path, gateways, key, rng):
    first, second = gateways
    header = make_tx(key, DOUBLE, [(b"trickle", b"1")])
    first.routes[f"/tx/{header['id']}"] = Route(body=json.dumps(header).encode(), trickle_s=0.2)
    second.publish_tx(header, DOUBLE)
    with port_for(tmp_path, first, second) as port:
        started = time.perf_counter()
        double_ok(port, header["id"], rng)
        print(f"served after cutting off the trickle: {time.perf_counter() - started:.1f} s "
              f"(the trickle alone would take {len(json.dumps(header)) * 0.2:.0f} s)")


def test_the_overall_deadline_ends_a_fetch(tmp_path, gateways, key):
    first, _ = gateways
    header = make_tx(key, DOUBLE, [(b"trickle", b"2")])
    first.routes[f"/tx/{header['id']}"] = Route(body=json.dumps(header).encode(), trickle_s=0.2)
    with port_for(tmp_path, first, KEM_FETCH_DEADLINE_MS="2000", KEM_FETCH_TIMEOUT_MS="60000") as port:
        started = time.perf_counter()
        with pytest.raises(PortError) as err:
            port.call("execute_kernel", header["id"].encode(), b"abcd", 1)
        print(f"cut off after {time.perf_counter() - started:.1f} s: {err.value.detail}")
        assert err.value.reason == "timeout" and "gateway #1" in err.value.detail


def test_slow_kernels_do_not_hold_up_other_kernels(tmp_path, gateways, key, rng):
    first, second = gateways
    slow = [make_tx(key, DOUBLE, [(b"slow", str(i).encode())]) for i in range(6)]
    for header in slow:  # slow at the first gateway; the second mirrors it
        first.publish_tx(header, DOUBLE)
        first.routes[f"/tx/{header['id']}"].delay_s = 6
        second.publish_tx(header, DOUBLE)
    fast_header = make_tx(key, DOUBLE, [(b"fast", b"1")])
    fast = first.publish_tx(fast_header, DOUBLE)
    second.publish_tx(fast_header, DOUBLE)
    warm = first.publish_tx(make_tx(key, DOUBLE, [(b"warm", b"1")]), DOUBLE)
    with port_for(tmp_path, first, second, KEM_FETCH_TIMEOUT_MS="20000") as port:
        double_ok(port, warm, rng)  # the compile worker is up: what follows is fetching
        pending = [port.call_async("execute_kernel", h["id"].encode(), b"abcd", 1) for h in slow]
        time.sleep(0.3)
        started = time.perf_counter()
        double_ok(port, fast, rng)
        print(f"a fast kernel behind 6 slow ones: {time.perf_counter() - started:.1f} s")
        assert not all(f.done() for f in pending), "the fast kernel waited for the slow ones"
        wait(pending, timeout=60)
        for f in pending:
            assert f.result() == reference.double(b"abcd", 4)


@pytest.mark.parametrize("junk", [
    {"Content-Length": "\u00b2"},  # str.isdigit() says yes, int() says no
    {"Content-Length": "1_0"},
    {"X-AR-IO-Root-Data-Item-Offset": "\u00b3"},  # superscript three: isdigit() again
])
def test_junk_headers_fail_that_gateway_only(tmp_path, gateways, key, rng, junk):
    first, second = gateways
    header = make_tx(key, DOUBLE, [(b"junk", json.dumps(junk).encode())])
    first.publish_tx(header, DOUBLE)
    first.routes[f"/raw/{header['id']}"].headers.update(junk)
    first.routes[f"/tx/{header['id']}"] = Route(404) if "X-AR-IO-Root-Data-Item-Offset" in junk else first.routes[f"/tx/{header['id']}"]
    second.publish_tx(header, DOUBLE)
    with port_for(tmp_path, first, second) as port:
        double_ok(port, header["id"], rng)


def test_header_integers_are_strict():
    assert header_int("1024") == 1024
    for junk in ("\u00b2", "1_0", " 7", "7 ", "-1", "+1", "0x10", "", "9" * 16, None):
        assert header_int(junk) is None


def test_ids_are_matched_whole(tmp_path, gateways):
    good = b64url_encode(bytes(range(32)))
    assert is_arweave_id(good) and not is_arweave_id(good + "\n")
    with pytest.raises(BadEncoding):
        b64url_decode(good[:40] + "\n")
    with port_for(tmp_path, *gateways) as port:
        for bad in (b"double\n", b"double\r\n", (good + "\n").encode()):
            with pytest.raises(PortError) as err:
                port.call("execute_kernel", bad, b"abcd", 1)
            assert err.value.reason in ("invalid_kernel_id", "bad_args")
        with pytest.raises(PortError) as err:
            port.call("execute", b"double", b"abcd", {"entry_point": b"main\n"})
        assert err.value.reason == "bad_args"
    assert all(gw.requests == [] for gw in gateways)


def test_errors_and_adapter_info_name_no_paths_or_urls(tmp_path, gateways, key, kernel_dir):
    first, second = gateways
    header = make_tx(key, DOUBLE, [(b"gone", b"1")])
    with port_for(tmp_path, first, second, KEM_KERNEL_DIR=str(kernel_dir)) as port:
        with pytest.raises(PortError) as err:
            port.call("execute_kernel", header["id"].encode(), b"abcd", 1)
        assert "gateway #1" in err.value.detail and "gateway #2" in err.value.detail
        with pytest.raises(PortError) as missing:
            port.call("execute_kernel", b"no_such_kernel", b"abcd", 1)
        assert missing.value.reason == "kernel_not_found"
        info = port.call("adapter_info").decode()
        for detail in (err.value.detail, missing.value.detail, info):
            assert first.url not in detail and second.url not in detail and "127.0.0.1" not in detail
            assert str(kernel_dir) not in detail and str(tmp_path) not in detail and str(PACKAGED_KERNELS) not in detail
