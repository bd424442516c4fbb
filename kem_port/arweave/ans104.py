"""Building ANS-104 data items (signature type 1, RSA-PSS), the format
proofs.py verifies: header fields, Avro-encoded tags, and the deep hash the
signature covers."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from kem_port.arweave.deephash import deep_hash
from kem_port.arweave.ids import b64url_encode
from kem_port.arweave.wallet import owner
from kem_port.errors import KemError

SIGNATURE_TYPE_RSA = 1
PSS_SALT = 32  # Arweave's RSA-PSS salt length (arweave-js; proofs.py accepts it)
MAX_TAGS = 128
MAX_TAG_NAME = 1024
MAX_TAG_VALUE = 3072
MAX_TAG_BYTES = 4096  # proofs.parse_item_header refuses more


@dataclass(frozen=True)
class BuiltItem:
    item_id: str
    raw: bytes  # the whole signed item, as posted
    payload_offset: int


def _zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte, z = z & 0x7F, z >> 7
        if not z:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def avro_tags(tags: list[tuple[bytes, bytes]]) -> bytes:
    """ANS-104 tags: an Avro array of {name, value} bytes records, written
    as one block (count, records) and the 0 end marker; empty when none."""
    if not tags:
        return b""
    body = b"".join(_zigzag_varint(len(n)) + n + _zigzag_varint(len(v)) + v for n, v in tags)
    return _zigzag_varint(len(tags)) + body + b"\x00"


def check_tags(tags: list[tuple[bytes, bytes]]) -> bytes:
    """The encoded tags, after ANS-104's limits (and kem's verifier's 4 KiB)."""
    if len(tags) > MAX_TAGS:
        raise KemError("bad_tags", f"{len(tags)} tags; ANS-104 allows {MAX_TAGS}")
    for name, value in tags:
        if not 0 < len(name) <= MAX_TAG_NAME or not 0 < len(value) <= MAX_TAG_VALUE:
            raise KemError("bad_tags", f"tag {name[:40]!r}: names are 1-{MAX_TAG_NAME} bytes, values 1-{MAX_TAG_VALUE}")
    raw = avro_tags(tags)
    if len(raw) > MAX_TAG_BYTES:
        raise KemError("bad_tags", f"tags take {len(raw)} bytes; kem verifies items with at most {MAX_TAG_BYTES}")
    return raw


def sign(key: rsa.RSAPrivateKey, message: bytes) -> bytes:
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=PSS_SALT)
    return key.sign(message, pss, hashes.SHA256())


def build(key: rsa.RSAPrivateKey, data: bytes, tags: list[tuple[bytes, bytes]]) -> BuiltItem:
    """A signed item with no target and no anchor; id = SHA-256(signature)."""
    who = owner(key)
    raw_tags = check_tags(tags)
    target = anchor = b""
    message = deep_hash(
        [b"dataitem", b"1", str(SIGNATURE_TYPE_RSA).encode(), who, target, anchor, raw_tags, data]
    )
    signature = sign(key, message)
    header = (
        struct.pack("<H", SIGNATURE_TYPE_RSA) + signature + who
        + b"\x00"  # no target
        + b"\x00"  # no anchor
        + struct.pack("<QQ", len(tags), len(raw_tags)) + raw_tags
    )
    item_id = b64url_encode(hashlib.sha256(signature).digest())
    return BuiltItem(item_id, header + data, len(header))
