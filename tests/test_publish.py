"""kem publish end to end, offline: a wallet made here, a loopback bundler
that takes the item and a loopback gateway that serves it as ar.io gateways
do, then the real port runs the kernel by its id under KEM_VERIFY=strict."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import reference
from arweave_fixture import Gateway
from cli_helpers import cli_env, kem
from conftest import start_port
from kem_port.arweave import ans104, proofs, publish, wallet
from kem_port.arweave.ids import b64url_encode
from kem_port.errors import KemError

DOUBLE = Path(__file__).parents[1] / "kem_port" / "kernels" / "double.wgsl"


class Bundler:
    """POST /tx takes an item (octet-stream) and hands it to the gateway,
    at an offset inside a bundle, with the X-AR-IO-Root-* headers."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.mode = "ok"  # or "refuse", "wrong_id"
        self.received: list[tuple[str, bytes]] = []
        bundler = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, answer = bundler.take(self.path, self.headers.get("Content-Type", ""), body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, path: str, content_type: str, body: bytes) -> tuple[int, bytes]:
        self.received.append((content_type, body))
        if path != "/tx" or content_type != "application/octet-stream":
            return 400, b'{"error": "POST an item to /tx as application/octet-stream"}'
        if self.mode == "refuse":
            return 402, b'{"error": "insufficient balance"}'
        item = proofs.parse_item_header(body)
        item_id = b64url_encode(hashlib.sha256(item.signature).digest())
        self.gateway.publish_item(item_id, body, item.data_offset)
        answered = "A" * 43 if self.mode == "wrong_id" else item_id
        return 200, json.dumps({"id": answered}).encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def wallet_file(tmp_path_factory):
    """A wallet made by `kem keygen` for this run only (never committed)."""
    tmp = tmp_path_factory.mktemp("wallet")
    done = kem(tmp, "keygen", str(tmp / "wallet.json"))
    assert done.returncode == 0, done.stderr
    path = tmp / "wallet.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert done.stdout.decode().strip() == wallet.address(wallet.load_jwk(path))
    return path


@pytest.fixture
def loopback():
    gateway = Gateway()
    bundler = Bundler(gateway)
    yield bundler
    bundler.close()
    gateway.close()


def test_publish_then_run_by_id_strict(tmp_path, rng, wallet_file, loopback):
    done = kem(tmp_path, "publish", str(DOUBLE), "--wallet", str(wallet_file), "--bundler", loopback.url, "--tag", "Version=1")
    assert done.returncode == 0, done.stderr
    item_id = done.stdout.decode().strip()
    content_type, body = loopback.received[-1]
    assert content_type == "application/octet-stream"
    assert b64url_encode(hashlib.sha256(proofs.parse_item_header(body).signature).digest()) == item_id
    env = {"KEM_GATEWAYS": loopback.gateway.url, "KEM_VERIFY": "strict", "KEM_CACHE_DIR": str(tmp_path / "cache"),
           "KEM_ALLOWED_OWNERS": wallet.address(wallet.load_jwk(wallet_file))}
    data = rng.bytes(4099)
    with start_port(**env) as port:
        out = port.call("execute_kernel", item_id.encode(), data, 2)
    assert out == reference.double(data, 2 * len(data))
    fetched = loopback.gateway.count(f"/raw/{item_id}")
    assert fetched >= 1
    # The same id through the command: fetched and verified again (own cache).
    env["KEM_CACHE_DIR"] = str(tmp_path / "cli-cache")
    # "--": an Arweave id may start with "-", which argparse would read as an option
    ran = kem(tmp_path, "-v", "run", "--hex", "05000000", "--", item_id, env=cli_env(tmp_path, **env))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == bytes.fromhex("0a000000")
    assert loopback.gateway.count(f"/raw/{item_id}") > fetched
    assert f"kem: fetching {item_id}".encode() in ran.stderr


def test_published_item_carries_tags_and_exact_bytes(tmp_path, wallet_file, loopback):
    done = kem(tmp_path, "publish", str(DOUBLE), "--wallet", str(wallet_file), "--bundler", loopback.url,
               "--tag", "Content-Type=text/wgsl", "--no-check")
    assert done.returncode == 0, done.stderr
    _, body = loopback.received[-1]
    item = proofs.parse_item_header(body)
    assert body[item.data_offset :] == DOUBLE.read_bytes()
    assert item.tag_count == 3
    assert b"text/wgsl" in item.raw_tags and b"text/plain" not in item.raw_tags and b"App-Name" in item.raw_tags


def test_bundler_refusal_and_wrong_id_are_errors(tmp_path, wallet_file, loopback):
    loopback.mode = "refuse"
    refused = kem(tmp_path, "publish", str(DOUBLE), "--wallet", str(wallet_file), "--bundler", loopback.url, "--no-check")
    assert refused.returncode == 1
    assert refused.stderr.decode().startswith("kem: bundler_refused: POST ") and "402" in refused.stderr.decode()
    assert refused.stdout == b""
    loopback.mode = "wrong_id"
    wrong = kem(tmp_path, "publish", str(DOUBLE), "--wallet", str(wallet_file), "--bundler", loopback.url, "--no-check")
    assert wrong.returncode == 1 and b"not the item's" in wrong.stderr


def test_invalid_kernel_is_not_published(tmp_path, wallet_file, loopback):
    (tmp_path / "bad.wgsl").write_text("fn main( {")
    done = kem(tmp_path, "publish", str(tmp_path / "bad.wgsl"), "--wallet", str(wallet_file), "--bundler", loopback.url)
    assert done.returncode == 1 and b"not a valid kem kernel, not publishing" in done.stderr
    assert loopback.received == []


# -- in-process: the item format and the wallet file -------------------------


@pytest.fixture(scope="module")
def key(wallet_file):
    return wallet.load_jwk(wallet_file)


def test_built_item_verifies_and_tampering_does_not(key, rng):
    data = rng.bytes(300)
    item = ans104.build(key, data, publish.kernel_tags([("A", "b")]))
    publish.verify_built(item)
    parsed = proofs.parse_item_header(item.raw)
    assert proofs.verify_item(item.item_id, parsed, data).owner_address == wallet.address(key)
    flipped = bytearray(item.raw)
    flipped[-1] ^= 1
    with pytest.raises(KemError) as err:
        publish.verify_built(ans104.BuiltItem(item.item_id, bytes(flipped), item.payload_offset))
    assert "bad_signature" in err.value.detail


def test_tag_limits(key):
    with pytest.raises(KemError) as err:
        ans104.build(key, b"x", [(b"n", b"")])
    assert err.value.reason == "bad_tags"
    with pytest.raises(KemError):
        ans104.build(key, b"x", [(b"n%d" % i, b"v" * 40) for i in range(100)])  # > 4 KiB of tags


def test_wallet_without_primes_and_bad_wallets(tmp_path, key):
    jwk = wallet.to_jwk(key)
    for name in ("p", "q", "dp", "dq", "qi"):
        del jwk[name]
    (tmp_path / "np.json").write_text(json.dumps(jwk))
    assert wallet.address(wallet.load_jwk(tmp_path / "np.json")) == wallet.address(key)
    (tmp_path / "ec.json").write_text(json.dumps({"kty": "EC"}))
    with pytest.raises(KemError) as err:
        wallet.load_jwk(tmp_path / "ec.json")
    assert err.value.reason == "bad_wallet"
