"""Offline Arweave for tests: signed transactions and data items made here,
served by a real HTTP server on 127.0.0.1 that can also misbehave."""

from __future__ import annotations

import hashlib
import json
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from kem_port.arweave.deephash import deep_hash
from kem_port.arweave.ids import b64url_encode
from kem_port.arweave.merkle import data_root


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=4096)


def owner_of(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_numbers().n.to_bytes(512, "big")


def address_of(key: rsa.RSAPrivateKey) -> str:
    return b64url_encode(hashlib.sha256(owner_of(key)).digest())


def sign(key: rsa.RSAPrivateKey, message: bytes, salt: int = 32) -> bytes:
    return key.sign(message, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=salt), hashes.SHA256())


def make_tx(key, data: bytes, tags: list[tuple[bytes, bytes]] = (), salt: int = 32) -> dict:
    """A signed format-2 transaction header, as GET /tx/{id} returns it."""
    owner = owner_of(key)
    root = data_root(data)
    size = str(len(data)).encode()
    message = deep_hash([b"2", owner, b"", b"0", b"1000", b"", [[n, v] for n, v in tags], size, root])
    signature = sign(key, message, salt)
    return {
        "format": 2,
        "id": b64url_encode(hashlib.sha256(signature).digest()),
        "last_tx": "",
        "owner": b64url_encode(owner),
        "tags": [{"name": b64url_encode(n), "value": b64url_encode(v)} for n, v in tags],
        "target": "",
        "quantity": "0",
        "data": "",
        "data_size": str(len(data)),
        "data_tree": [],
        "data_root": b64url_encode(root),
        "reward": "1000",
        "signature": b64url_encode(signature),
    }


def _zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte = z & 0x7F
        z >>= 7
        if z:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def avro_tags(tags: list[tuple[bytes, bytes]]) -> bytes:
    """Canonical ANS-104 tag bytes: one block, then the 0 end marker."""
    if not tags:
        return b""
    body = b"".join(_zigzag_varint(len(n)) + n + _zigzag_varint(len(v)) + v for n, v in tags)
    return _zigzag_varint(len(tags)) + body + b"\x00"


def make_item(key, data: bytes, tags: list[tuple[bytes, bytes]] = ()) -> tuple[str, bytes, int]:
    """An RSA (type 1) ANS-104 item: (id, item bytes, payload offset)."""
    owner = owner_of(key)
    raw_tags = avro_tags(list(tags))
    message = deep_hash([b"dataitem", b"1", b"1", owner, b"", b"", raw_tags, data])
    signature = sign(key, message)
    header = (
        struct.pack("<H", 1) + signature + owner + b"\x00\x00"
        + struct.pack("<QQ", len(tags), len(raw_tags)) + raw_tags
    )
    return b64url_encode(hashlib.sha256(signature).digest()), header + data, len(header)


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0
    trickle_s: float = 0.0  # sleep between body bytes: a gateway that never quite stops


class Gateway:
    """routes: path -> Route (or a callable(handler) -> Route); requests: log."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                gateway._serve(self, body=True)

            def do_HEAD(self) -> None:
                gateway._serve(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _serve(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        with self._lock:
            self.requests.append((handler.command, handler.path))
        route = self.routes.get(handler.path, Route(404, b"not found"))
        if callable(route):
            route = route(handler)
        if route.delay_s:
            time.sleep(route.delay_s)
        payload = route.body
        status = route.status
        rng = handler.headers.get("Range")
        if rng and status == 200 and rng.startswith("bytes="):
            start, end = (int(x) for x in rng[6:].split("-"))
            payload, status = payload[start : end + 1], 206
        try:
            handler.send_response(status)
            headers = {"Content-Length": str(len(payload)), **route.headers}
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            if body and route.trickle_s:
                for i in range(len(payload)):
                    handler.wfile.write(payload[i : i + 1])
                    handler.wfile.flush()
                    time.sleep(route.trickle_s)
            elif body:
                handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def count(self, fragment: str) -> int:
        with self._lock:
            return sum(1 for _, path in self.requests if fragment in path)

    def publish_tx(self, header: dict, data: bytes) -> str:
        tx_id = header["id"]
        self.routes[f"/tx/{tx_id}"] = Route(body=json.dumps(header).encode(), headers={"Content-Type": "application/json"})
        self.routes[f"/raw/{tx_id}"] = Route(body=data)
        return tx_id

    def publish_item(self, item_id: str, item: bytes, payload_offset: int, root_id: str = "R" * 43, at: int = 1000) -> str:
        bundle = bytes(at) + item
        self.routes[f"/raw/{root_id}"] = Route(body=bundle)
        self.routes[f"/raw/{item_id}"] = Route(
            body=item[payload_offset:],
            headers={
                "X-AR-IO-Root-Transaction-Id": root_id,
                "X-AR-IO-Root-Data-Item-Offset": str(at),
                "X-AR-IO-Root-Data-Offset": str(at + payload_offset),
                "X-AR-IO-Data-Item-Size": str(len(item)),
            },
        )
        return item_id

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
