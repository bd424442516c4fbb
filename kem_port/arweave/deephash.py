"""Arweave's deep hash (SHA-384 over a tree of blobs and lists)."""

from __future__ import annotations

import hashlib
from typing import Union

DeepItem = Union[bytes, list["DeepItem"]]


def _sha384(data: bytes) -> bytes:
    return hashlib.sha384(data).digest()


def deep_hash(item: DeepItem) -> bytes:
    if isinstance(item, list):
        acc = _sha384(b"list" + str(len(item)).encode())
        for child in item:
            acc = _sha384(acc + deep_hash(child))
        return acc
    tag = _sha384(b"blob" + str(len(item)).encode())
    return _sha384(tag + _sha384(bytes(item)))
