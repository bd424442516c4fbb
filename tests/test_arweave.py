"""Kernels by Arweave ID, offline: public vectors, and a loopback gateway
serving transactions and items signed here, honest or not."""

from __future__ import annotations

import gzip
import hashlib
import json
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import pytest

import reference
from arweave_fixture import Gateway, Route, address_of, make_item, make_tx, new_key
from conftest import start_port
from kem_port.arweave import merkle, proofs
from kem_port.arweave.ids import b64url_decode, b64url_encode, is_arweave_id
from kem_port.client import PortError

DATA = Path(__file__).parent / "data" / "arweave"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "arweave"
DOUBLE = (Path(__file__).parents[1] / "kem_port" / "kernels" / "double.wgsl").read_bytes()
ADD_ONE = b"""
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&b)) { b[g.x] = a[g.x] + 1u; }
}
"""


# -- public vectors ---------------------------------------------------------


def mainnet_headers():
    return sorted(p for p in DATA.glob("*.json") if not p.name.endswith("offset.json") and p.name != "signed_v2_tx.json")


@pytest.mark.parametrize("path", mainnet_headers(), ids=lambda p: p.stem[:8])
def test_mainnet_headers_verify(path):
    header = json.loads(path.read_text())
    proven = proofs.verify_l1_header(path.stem, header)
    assert proven.owner_address == b64url_encode(hashlib.sha256(b64url_decode(header["owner"])).digest())


def test_mainnet_header_with_its_data():
    tx = "----LT69qUmuIeC4qb0MZHlxVp7UxLu_14rEkA_9n6w"
    proven = proofs.verify_l1_header(tx, json.loads((DATA / f"{tx}.json").read_text()))
    data = (DATA / f"{tx}.data").read_bytes()
    proofs.verify_l1_data(proven, data)
    flipped = bytearray(data)
    flipped[12345] ^= 1
    with pytest.raises(proofs.ProofError) as err:
        proofs.verify_l1_data(proven, bytes(flipped))
    assert err.value.reason == "data_root_mismatch"


def test_mainnet_header_edited_fails():
    path = mainnet_headers()[0]
    header = json.loads(path.read_text())
    header["data_size"] = str(int(header["data_size"]) + 1)
    with pytest.raises(proofs.ProofError) as err:
        proofs.verify_l1_header(path.stem, header)
    assert err.value.reason == "bad_signature"
    with pytest.raises(proofs.ProofError) as err:
        proofs.verify_l1_header(mainnet_headers()[1].stem, json.loads(path.read_text()))
    assert err.value.reason == "id_mismatch"


def test_known_data_roots():
    assert b64url_encode(merkle.data_root((DATA / "rebar3.bin").read_bytes())) == "t-GCOnjPWxdox950JsrFMu3nzOE4RktXpMcIlkqSUTw"
    fixture = SHARED / "arweave-js" / "unsigned_v2_tx.json"
    if not fixture.exists():
        pytest.skip(f"{fixture} absent (shared test data not beside the checkout)")
    data = b64url_decode(json.loads(fixture.read_text())["data"])
    assert len(data) == 11 * 256 * 1024  # an exact multiple: needs the empty last leaf
    assert b64url_encode(merkle.data_root(data)) == "3mSWTJfNIRuBKkirYk4Eq-6GnKqzgEcYKbgTnLp1NhQ"


def test_chunking_rules():
    k = 256 * 1024
    assert merkle.client_chunks(2 * k) == [(0, k), (k, 2 * k), (2 * k, 2 * k)]
    # A remainder under 32 KiB: the last two chunks are rebalanced.
    assert merkle.client_chunks(k + 1000) == [(0, 131572), (131572, k + 1000)]
    assert merkle.client_chunks(3 * k + 40000)[-1] == (3 * k, 3 * k + 40000)
    assert merkle.data_root(b"") == b""


@pytest.mark.parametrize("path", sorted(DATA.glob("data_item_*")), ids=lambda p: p.name[10:18])
def test_public_data_items_verify(path):
    item_id = path.name[len("data_item_") :]
    buf = path.read_bytes()
    item = proofs.parse_item_header(buf)
    proofs.verify_item(item_id, item, buf[item.data_offset :])
    if len(buf) > item.data_offset:
        tampered = buf[:-1] + bytes([buf[-1] ^ 1])
        with pytest.raises(proofs.ProofError):
            proofs.verify_item(item_id, item, tampered[item.data_offset :])


def test_id_validation():
    assert is_arweave_id("btSvNclyu2me_zGh4X9ULVRZqwze9l2DpkcVHcLw9Eg")
    assert not is_arweave_id("btSvNclyu2me_zGh4X9ULVRZqwze9l2DpkcVHcLw9E")  # 42
    assert not is_arweave_id("btSvNclyu2me_zGh4X9ULVRZqwze9l2DpkcVHcLw9E=")
    assert not is_arweave_id("btSvNclyu2me_zGh4X9ULVRZqwze9l2DpkcVHcLw9Eh")  # non-canonical tail bits
    assert not is_arweave_id("double")


# -- the loopback gateway ----------------------------------------------------


@pytest.fixture(scope="module")
def key():
    return new_key()


@pytest.fixture(scope="module")
def other_key():
    return new_key()


@pytest.fixture
def gateway():
    gw = Gateway()
    yield gw
    gw.close()


@pytest.fixture
def second_gateway():
    gw = Gateway()
    yield gw
    gw.close()


def arweave_port(tmp_path, *gateways, **env):
    return start_port(
        KEM_GATEWAYS=",".join(g.url for g in gateways),
        KEM_CACHE_DIR=str(tmp_path / "cache"),
        KEM_FETCH_TIMEOUT_MS="1500",
        KEM_FETCH_RETRIES="1",
        **env,
    )


def run_double(port, kernel_id: str, rng) -> None:
    data = rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes()
    assert port.call("execute_kernel", kernel_id.encode(), data, 2) == reference.double(data, 2 * len(data))


def fails_with(port, kernel_id: str) -> tuple[str, str]:
    with pytest.raises(PortError) as err:
        port.call("execute_kernel", kernel_id.encode(), b"abcd", 1)
    return err.value.reason, err.value.detail


def test_genuine_l1_and_item_kernels_run(tmp_path, gateway, key, rng):
    tx_id = gateway.publish_tx(make_tx(key, DOUBLE, [(b"Content-Type", b"text/wgsl")]), DOUBLE)
    item_id, item, offset = make_item(key, ADD_ONE, [(b"Content-Type", b"text/wgsl")])
    gateway.publish_item(item_id, item, offset)
    with arweave_port(tmp_path, gateway) as port:
        run_double(port, tx_id, rng)
        words = rng.integers(0, 2**31, 1000, dtype=np.uint32)
        out = np.frombuffer(port.call("execute_kernel", item_id.encode(), words.tobytes(), 1), dtype="<u4")
        np.testing.assert_array_equal(out, words + 1)
        stats = port.call("stats")
        from kem_port.wire.terms import atom

        assert stats[atom("arweave_fetches")] == 2
        config = port.call("config")
        assert config[atom("verify")].value == b"strict"


def tampered_cases(key, other_key):
    good = make_tx(key, DOUBLE)
    other = make_tx(key, ADD_ONE)
    edited_tag = make_tx(key, DOUBLE, [(b"App", b"kem")])
    edited_tag["tags"][0]["value"] = b64url_encode(b"evil")
    edited_size = make_tx(key, DOUBLE)
    edited_size["data_size"] = str(len(DOUBLE) + 4)
    swapped = make_tx(key, DOUBLE)
    swapped["owner"] = make_tx(other_key, DOUBLE)["owner"]
    flipped = bytearray(DOUBLE)
    flipped[100] ^= 0x20
    return [
        ("flipped byte", good, bytes(flipped), "data_root_mismatch"),
        ("truncated", good, DOUBLE[:-1], "size_mismatch"),
        ("extended", good, DOUBLE + b"\n", "size_mismatch"),
        ("another id's header", {**other, "id": good["id"]}, DOUBLE, "id_mismatch"),
        ("edited tag", edited_tag, DOUBLE, "bad_signature"),
        ("edited data_size", edited_size, DOUBLE + b"\n\n\n\n", "bad_signature"),
        ("swapped owner", swapped, DOUBLE, "bad_signature"),
    ]


def test_tampered_kernels_never_run(tmp_path, gateway, key, other_key):
    cases = tampered_cases(key, other_key)
    # Several cases share `good`'s id: each is published just before its call.
    with arweave_port(tmp_path, gateway) as port:
        for name, header, body, reason in cases:
            gateway.routes[f"/tx/{header['id']}"] = Route(body=json.dumps(header).encode())
            gateway.routes[f"/raw/{header['id']}"] = Route(body=body)
            got, detail = fails_with(port, header["id"])
            assert got == reason, (name, detail)
        assert not list((tmp_path / "cache").glob("*.kem")), "nothing unverified may be cached"


def test_item_tampering(tmp_path, gateway, key):
    item_id, item, offset = make_item(key, ADD_ONE)
    gateway.publish_item(item_id, item[:-1] + bytes([item[-1] ^ 1]), offset)
    with arweave_port(tmp_path, gateway) as port:
        assert fails_with(port, item_id)[0] == "bad_signature"
        gateway.routes.pop(f"/raw/{item_id}")
        assert fails_with(port, item_id)[0] == "not_found"
        gateway.routes[f"/raw/{item_id}"] = Route(body=ADD_ONE)  # no offsets: header unavailable
        assert fails_with(port, item_id)[0] == "header_unavailable"


def test_owner_allow_list(tmp_path, gateway, key, other_key, rng):
    tx_id = gateway.publish_tx(make_tx(other_key, DOUBLE), DOUBLE)
    good_id = gateway.publish_tx(make_tx(key, DOUBLE, [(b"n", b"1")]), DOUBLE)
    with arweave_port(tmp_path, gateway, KEM_ALLOWED_OWNERS=address_of(key)) as port:
        reason, detail = fails_with(port, tx_id)
        assert reason == "owner_not_allowed" and address_of(other_key) in detail
        run_double(port, good_id, rng)


@pytest.mark.parametrize("failure", ["500", "timeout", "lie", "gzip"])
def test_bad_gateway_then_honest_one(tmp_path, gateway, second_gateway, key, failure, rng):
    header = make_tx(key, DOUBLE, [(b"case", failure.encode())])
    tx_id = second_gateway.publish_tx(header, DOUBLE)
    if failure == "500":
        gateway.routes[f"/tx/{tx_id}"] = Route(500, b"oops")
    elif failure == "timeout":
        gateway.routes[f"/tx/{tx_id}"] = Route(body=json.dumps(header).encode(), delay_s=4)
    elif failure == "lie":
        gateway.publish_tx(header, DOUBLE.replace(b"2u", b"3u"))
    else:  # really gzip-encoded bytes, whatever we asked: never decoded, so they fail the proof
        gateway.publish_tx(header, gzip.compress(DOUBLE))
        gateway.routes[f"/raw/{tx_id}"].headers["Content-Encoding"] = "gzip"
    with arweave_port(tmp_path, gateway, second_gateway) as port:
        run_double(port, tx_id, rng)
    assert gateway.count(tx_id) >= 1 and second_gateway.count(tx_id) >= 1


def test_gzip_header_lie_on_plain_bytes_is_harmless(tmp_path, gateway, key, rng):
    tx_id = gateway.publish_tx(make_tx(key, DOUBLE, [(b"gz", b"lie")]), DOUBLE)
    gateway.routes[f"/raw/{tx_id}"].headers["Content-Encoding"] = "gzip"
    with arweave_port(tmp_path, gateway) as port:
        run_double(port, tx_id, rng)


def test_every_gateway_failing_is_one_error_naming_each(tmp_path, gateway, second_gateway, key):
    header = make_tx(key, DOUBLE, [(b"all", b"bad")])
    gateway.routes[f"/tx/{header['id']}"] = Route(500)
    second_gateway.publish_tx(header, DOUBLE[:-3])
    with arweave_port(tmp_path, gateway, second_gateway) as port:
        reason, detail = fails_with(port, header["id"])
    assert reason == "fetch_failed"
    # Each gateway by its number; their URLs stay in the node's log (issue 13).
    assert "gateway #1" in detail and "gateway #2" in detail and "size_mismatch" in detail
    assert gateway.url not in detail and second_gateway.url not in detail


def test_oversized_kernel_is_refused_before_download(tmp_path, gateway, key):
    big = DOUBLE + b"//" + b"x" * 5000 + b"\n"
    tx_id = gateway.publish_tx(make_tx(key, big), big)
    with arweave_port(tmp_path, gateway, KEM_MAX_KERNEL_BYTES="4096") as port:
        assert fails_with(port, tx_id)[0] == "too_large"
    assert gateway.count(f"/raw/{tx_id}") == 0


@pytest.mark.parametrize("size", [2 * 256 * 1024, 256 * 1024 + 1000])
def test_sizes_at_chunk_edges(tmp_path, gateway, key, size, rng):
    body = DOUBLE + b"\n//" + b"k" * (size - len(DOUBLE) - 4) + b"\n"
    assert len(body) == size
    tx_id = gateway.publish_tx(make_tx(key, body), body)
    with arweave_port(tmp_path, gateway, KEM_MAX_KERNEL_BYTES=str(1 << 20)) as port:
        run_double(port, tx_id, rng)


def test_cache_serves_without_network_and_survives_corruption(tmp_path, gateway, key, rng):
    tx_id = gateway.publish_tx(make_tx(key, DOUBLE, [(b"c", b"1")]), DOUBLE)
    with arweave_port(tmp_path, gateway) as port:
        run_double(port, tx_id, rng)
    seen = len(gateway.requests)
    with arweave_port(tmp_path, gateway) as port:  # a new process: disk cache
        run_double(port, tx_id, rng)
        run_double(port, tx_id, rng)
    assert len(gateway.requests) == seen, "a cached kernel must cost no request"
    entry = tmp_path / "cache" / f"{tx_id}.kem"
    raw = bytearray(entry.read_bytes())
    raw[-5] ^= 1
    entry.write_bytes(bytes(raw))
    with arweave_port(tmp_path, gateway) as port:
        run_double(port, tx_id, rng)
        from kem_port.wire.terms import atom

        assert port.call("stats")[atom("arweave_cache_corrupt")] == 1
    assert gateway.count(f"/tx/{tx_id}") == 2


def test_concurrent_first_calls_fetch_once(tmp_path, gateway, key, rng):
    tx_id = gateway.publish_tx(make_tx(key, DOUBLE, [(b"sf", b"1")]), DOUBLE)
    gateway.routes[f"/tx/{tx_id}"].delay_s = 0.3
    with arweave_port(tmp_path, gateway) as port:
        inputs = [rng.integers(0, 256, 64, dtype=np.uint8).tobytes() for _ in range(20)]
        futures = [port.call_async("execute_kernel", tx_id.encode(), d, 1) for d in inputs]
        wait(futures, timeout=60)
        for d, f in zip(inputs, futures):
            assert f.result() == reference.double(d, len(d))
    assert gateway.count(f"/tx/{tx_id}") == 1 and gateway.count(f"/raw/{tx_id}") == 1


def test_pinned_and_off_tiers(tmp_path, gateway, key, rng):
    tx_id = gateway.publish_tx(make_tx(key, DOUBLE, [(b"p", b"1")]), DOUBLE)
    unpinned = gateway.publish_tx(make_tx(key, DOUBLE, [(b"p", b"2")]), DOUBLE)
    pins = tmp_path / "pins"
    pins.write_text(f"# operator pins\n{tx_id} {hashlib.sha256(DOUBLE).hexdigest()}\n")
    with arweave_port(tmp_path, gateway, KEM_VERIFY="pinned", KEM_PINS=str(pins)) as port:
        run_double(port, tx_id, rng)
        assert fails_with(port, unpinned)[0] == "not_pinned"
    gateway.routes.clear()  # offline: the pinned bytes come from the cache
    with arweave_port(tmp_path, gateway, KEM_VERIFY="pinned", KEM_PINS=str(pins)) as port:
        run_double(port, tx_id, rng)
    bad_pin = tmp_path / "bad_pins"
    other = gateway.publish_tx(make_tx(key, DOUBLE, [(b"p", b"3")]), DOUBLE)
    bad_pin.write_text(f"{other} {'0' * 64}\n")
    with arweave_port(tmp_path, gateway, KEM_VERIFY="strict+pinned", KEM_PINS=str(bad_pin)) as port:
        assert fails_with(port, other)[0] == "pin_mismatch"
    flipped = DOUBLE.replace(b"2u", b"2u ")
    loose = gateway.publish_tx(make_tx(key, DOUBLE, [(b"p", b"4")]), flipped)
    with arweave_port(tmp_path, gateway, KEM_VERIFY="off") as port:
        run_double(port, loose, rng)  # unverified, and still the right kernel by luck of the test


def test_invalid_ids_never_reach_the_network(tmp_path, gateway):
    with arweave_port(tmp_path, gateway) as port:
        assert fails_with(port, "btSvNclyu2me_zGh4X9ULVRZqwze9l2DpkcVHcLw9Eh")[0] == "kernel_not_found"
        assert fails_with(port, "not-an-id")[0] == "kernel_not_found"
    assert gateway.requests == []


def test_a_refused_proven_kernel_is_not_fetched_again(tmp_path, gateway, key, rng):
    """A published kernel the lexer refuses (non-ASCII outside a comment) is
    refused from memory after its first fetch: its bytes are proven, so the
    refusal holds for its id for good, and a caller repeating it must not
    make the node fetch it from a gateway on every call."""
    hostile = DOUBLE.replace(b"fn main", "fn ma\u0456n".encode())  # a Cyrillic i
    tx_id = gateway.publish_tx(make_tx(key, hostile, [(b"r", b"1")]), hostile)
    with arweave_port(tmp_path, gateway) as port:
        reasons = {fails_with(port, tx_id)[0] for _ in range(4)}
        assert reasons == {"bad_kernel"}
        assert gateway.count(f"/raw/{tx_id}") == 1, "a refused kernel was fetched again"
        run_double(port, gateway.publish_tx(make_tx(key, DOUBLE, [(b"r", b"2")]), DOUBLE), rng)
