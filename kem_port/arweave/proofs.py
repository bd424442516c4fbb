"""Proof that bytes are the data of an Arweave ID (layer 1 and ANS-104).

For both, ID = SHA-256(signature) and the signature (RSA-PSS, SHA-256)
covers the owner's key and a commitment to the data, so a gateway can make a
fetch fail but never make other bytes pass. Each check raises
:class:`ProofError` with one of the reasons the README lists.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa

from kem_port.arweave.deephash import deep_hash
from kem_port.arweave.ids import BadEncoding, b64url_decode, b64url_encode
from kem_port.arweave.merkle import client_chunks, data_root, plain_chunks
from kem_port.errors import KemError

RSA_E = 65537
ANS104_TYPES = {1: ("rsa", 512, 512), 2: ("ed25519", 64, 32)}


class ProofError(KemError):
    """A proof check failed; reason is one of the README's Arweave reasons."""


@dataclass(frozen=True)
class Proven:
    """What a verified header commits to."""

    kind: str  # "l1" or "ans104"
    owner_address: str
    data_size: int
    data_root: bytes | None  # L1 format 2
    inline_data: bytes | None  # L1 format 1: the data itself


def owner_address(owner: bytes) -> str:
    return b64url_encode(hashlib.sha256(owner).digest())


def _verify_rsa(owner: bytes, signature: bytes, message: bytes) -> None:
    key = rsa.RSAPublicNumbers(RSA_E, int.from_bytes(owner, "big")).public_key()
    try:
        key.verify(
            signature,
            message,
            padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.AUTO),
            hashes.SHA256(),
        )
    except InvalidSignature:
        raise ProofError("bad_signature", "RSA-PSS signature does not verify under the owner key") from None


def _check_id(kernel_id: str, signature: bytes) -> None:
    if b64url_encode(hashlib.sha256(signature).digest()) != kernel_id:
        raise ProofError("id_mismatch", "SHA-256 of the signature is not the requested ID")


def _field(header: dict, name: str) -> bytes:
    try:
        return b64url_decode(header.get(name, "") or "")
    except BadEncoding as exc:
        raise ProofError("bad_header", f"{name}: {exc}") from None


def _decimal(header: dict, name: str) -> str:
    value = str(header.get(name, "0"))
    if not value.isdigit():
        raise ProofError("bad_header", f"{name} is not a decimal string")
    return value


def verify_l1_header(kernel_id: str, header: Any) -> Proven:
    """Steps 1-4 of arweave-integrity §1: id, signature, and what it commits to."""
    if not isinstance(header, dict):
        raise ProofError("bad_header", "transaction header is not a JSON object")
    if header.get("id") != kernel_id:
        raise ProofError("id_mismatch", f"header is for {str(header.get('id'))[:50]!r}")
    fmt = int(header.get("format", 1)) if str(header.get("format", 1)).isdigit() else -1
    owner, signature = _field(header, "owner"), _field(header, "signature")
    if not owner:
        raise ProofError("unsupported_signature_type", "empty owner (secp256k1 L1 transactions are not supported)")
    _check_id(kernel_id, signature)
    target, last_tx = _field(header, "target"), _field(header, "last_tx")
    quantity, reward = _decimal(header, "quantity"), _decimal(header, "reward")
    tags = []
    for tag in header.get("tags") or []:
        if not isinstance(tag, dict):
            raise ProofError("bad_header", "tag is not an object")
        tags.append([_field(tag, "name"), _field(tag, "value")])
    denomination = str(header.get("denomination", "0") or "0")
    if fmt == 2:
        size = _decimal(header, "data_size")
        root = _field(header, "data_root")
        items: list = [b"2", owner, target, quantity.encode(), reward.encode(), last_tx, tags, size.encode(), root]
        if denomination not in ("", "0"):
            items.insert(0, denomination.encode())
        _verify_rsa(owner, signature, deep_hash(items))
        return Proven("l1", owner_address(owner), int(size), root, None)
    if fmt == 1:
        data = _field(header, "data")
        if denomination not in ("", "0"):
            message = deep_hash([denomination.encode(), owner, target, data, quantity.encode(), reward.encode(), last_tx, tags])
        else:
            message = owner + target + data + quantity.encode() + reward.encode() + last_tx + b"".join(n + v for n, v in tags)
        _verify_rsa(owner, signature, message)
        return Proven("l1", owner_address(owner), len(data), None, data)
    raise ProofError("bad_header", f"unknown transaction format {header.get('format')!r}")


def verify_l1_data(proven: Proven, body: bytes) -> None:
    """Step 5: the bytes match the size and root the signature covers."""
    if proven.inline_data is not None:
        if body != proven.inline_data:
            raise ProofError("data_root_mismatch", "bytes differ from the signed format-1 data")
        return
    if len(body) != proven.data_size:
        raise ProofError("size_mismatch", f"got {len(body)} bytes, the header says {proven.data_size}")
    if data_root(body, client_chunks(len(body))) == proven.data_root:
        return
    # Inline-posted data is chunked plainly by the node (differs only past
    # 256 KiB with a remainder under 32 KiB).
    if data_root(body, plain_chunks(len(body))) == proven.data_root:
        return
    raise ProofError("data_root_mismatch", "the data's Merkle root is not the signed data_root")


# -- ANS-104 ---------------------------------------------------------------


@dataclass(frozen=True)
class DataItem:
    signature_type: int
    signature: bytes
    owner: bytes
    target: bytes
    anchor: bytes
    raw_tags: bytes
    tag_count: int
    data_offset: int  # where the payload starts within the item


def _optional32(buf: bytes, pos: int, name: str) -> tuple[bytes, int]:
    if pos >= len(buf):
        raise ProofError("bad_header", f"item ends before {name}")
    flag = buf[pos]
    if flag == 0:
        return b"", pos + 1
    if flag == 1:
        if pos + 33 > len(buf):
            raise ProofError("bad_header", f"item ends inside {name}")
        return buf[pos + 1 : pos + 33], pos + 33
    raise ProofError("bad_header", f"{name} presence byte is {flag}")


def parse_item_header(buf: bytes) -> DataItem:
    """Parse an item's header from its first bytes (payload may be absent)."""
    if len(buf) < 2:
        raise ProofError("bad_header", "item shorter than its signature type")
    (sig_type,) = struct.unpack_from("<H", buf, 0)
    if sig_type not in ANS104_TYPES:
        raise ProofError("unsupported_signature_type", f"ANS-104 signature type {sig_type}")
    _, sig_len, owner_len = ANS104_TYPES[sig_type]
    pos = 2
    if len(buf) < pos + sig_len + owner_len:
        raise ProofError("bad_header", "item ends inside signature or owner")
    signature = buf[pos : pos + sig_len]
    owner = buf[pos + sig_len : pos + sig_len + owner_len]
    pos += sig_len + owner_len
    target, pos = _optional32(buf, pos, "target")
    anchor, pos = _optional32(buf, pos, "anchor")
    if len(buf) < pos + 16:
        raise ProofError("bad_header", "item ends inside the tag header")
    tag_count, tag_bytes = struct.unpack_from("<QQ", buf, pos)
    pos += 16
    if tag_count > 128 or tag_bytes > 4096:
        raise ProofError("bad_header", f"{tag_count} tags in {tag_bytes} bytes exceed ANS-104 limits")
    if len(buf) < pos + tag_bytes:
        raise ProofError("bad_header", "item ends inside its tags")
    raw_tags = buf[pos : pos + tag_bytes]
    return DataItem(sig_type, signature, owner, target, anchor, raw_tags, tag_count, pos + tag_bytes)


def verify_item(kernel_id: str, item: DataItem, payload: bytes) -> Proven:
    _check_id(kernel_id, item.signature)
    message = deep_hash(
        [b"dataitem", b"1", str(item.signature_type).encode(), item.owner, item.target, item.anchor, item.raw_tags, payload]
    )
    if item.signature_type == 1:
        _verify_rsa(item.owner, item.signature, message)
    else:
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(item.owner).verify(item.signature, message)
        except InvalidSignature:
            raise ProofError("bad_signature", "ed25519 signature does not verify") from None
    return Proven("ans104", owner_address(item.owner), len(payload), None, None)
