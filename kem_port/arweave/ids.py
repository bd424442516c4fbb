"""Arweave IDs and strict base64url (no padding, no stray characters)."""

from __future__ import annotations

import base64
import binascii
import re

_B64URL = re.compile(r"[A-Za-z0-9_-]*")  # fullmatch: "$" would let "\n" end it


class BadEncoding(ValueError):
    pass


def b64url_decode(text: str) -> bytes:
    """Decode unpadded base64url, refusing anything that would not re-encode
    to the same text (urlsafe_b64decode silently drops foreign characters)."""
    if not isinstance(text, str) or not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise BadEncoding(f"not base64url: {str(text)[:60]!r}")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise BadEncoding(str(exc)) from None
    if b64url_encode(raw) != text:
        raise BadEncoding(f"non-canonical base64url: {text[:60]!r}")
    return raw


def b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def is_arweave_id(text: str) -> bool:
    """43 characters of base64url that decode to 32 bytes and re-encode the same."""
    if len(text) != 43:
        return False
    try:
        return len(b64url_decode(text)) == 32
    except BadEncoding:
        return False
