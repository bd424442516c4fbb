"""data_root: the Merkle root of a format-2 transaction's data.

Chunking follows arweave-js (the standard client): 256 KiB chunks, the last
two rebalanced when a remainder under 32 KiB would be left, and a final
chunk emitted even when empty (so data of an exact multiple of 256 KiB ends
in an empty leaf). The node's inline-data chunking (plain 256 KiB) is the
fallback, tried by the verifier when the first root does not match.
"""

from __future__ import annotations

import hashlib

MAX_CHUNK = 256 * 1024
MIN_CHUNK = 32 * 1024


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _note(n: int) -> bytes:
    return n.to_bytes(32, "big")


def client_chunks(size: int) -> list[tuple[int, int]]:
    bounds = []
    pos, rest = 0, size
    while rest >= MAX_CHUNK:
        step = MAX_CHUNK
        after = rest - MAX_CHUNK
        if 0 < after < MIN_CHUNK:
            step = -(-rest // 2)
        bounds.append((pos, pos + step))
        pos += step
        rest -= step
    bounds.append((pos, pos + rest))
    return bounds


def plain_chunks(size: int) -> list[tuple[int, int]]:
    bounds = [(p, min(p + MAX_CHUNK, size)) for p in range(0, size, MAX_CHUNK)]
    if size % MAX_CHUNK == 0:
        bounds.append((size, size))
    return bounds


def data_root(data: bytes | memoryview, bounds: list[tuple[int, int]] | None = None) -> bytes:
    """The 32-byte root; b"" for empty data (its data_root field is empty)."""
    if len(data) == 0:
        return b""
    view = memoryview(data)
    nodes = [
        (_sha256(_sha256(_sha256(view[a:b])) + _sha256(_note(b))), b)
        for a, b in (bounds if bounds is not None else client_chunks(len(data)))
    ]
    while len(nodes) > 1:
        layer = []
        for i in range(0, len(nodes) - 1, 2):
            (left, left_end), (right, right_end) = nodes[i], nodes[i + 1]
            layer.append((_sha256(_sha256(left) + _sha256(right) + _sha256(_note(left_end))), right_end))
        if len(nodes) % 2:
            layer.append(nodes[-1])
        nodes = layer
    return nodes[0][0]
