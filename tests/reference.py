"""numpy references for the example kernels: the tests' ground truth."""

from __future__ import annotations

import numpy as np

U32 = np.uint32


def double(data: bytes, output_size: int) -> bytes:
    padded = data + bytes(-len(data) % 4)
    words = np.frombuffer(padded, dtype="<u4")
    out_words = -(-output_size // 4)
    out = np.zeros(out_words, dtype="<u4")
    n = min(len(words), out_words)
    out[:n] = words[:n] * U32(2)
    return out.tobytes()[:output_size]


def pixelize(image: np.ndarray, pixel_size: int) -> np.ndarray:
    """image: (h, w, 4) uint8. Block means, rounded down, per channel."""
    h, w, _ = image.shape
    size = max(pixel_size, 1)
    ys = np.arange(0, h, size)
    xs = np.arange(0, w, size)
    sums = np.add.reduceat(np.add.reduceat(image.astype(np.uint64), ys, axis=0), xs, axis=1)
    heights = np.diff(np.append(ys, h))
    widths = np.diff(np.append(xs, w))
    means = sums // (heights[:, None] * widths[None, :])[:, :, None]
    return np.repeat(np.repeat(means, heights, axis=0), widths, axis=1).astype(np.uint8)


def _mix(v: np.ndarray) -> np.ndarray:
    state = v * U32(747796405) + U32(2891336453)
    word = ((state >> ((state >> U32(28)) + U32(4))) ^ state) * U32(277803737)
    return (word >> U32(22)) ^ word


def glitch(image: np.ndarray, seed: int, strength: int) -> np.ndarray:
    h, w, _ = image.shape
    words = np.ascontiguousarray(image).view("<u4").reshape(h, w)
    bands = (np.arange(h, dtype=U32) // U32(8)) ^ U32((seed * 2654435761) % 2**32)
    r = _mix(bands)
    shift = np.where((r & U32(3)) == 0, ((r >> U32(2)) % U32(max(strength, 1))) % U32(w), U32(0)).astype(np.int64)
    x = np.arange(w, dtype=np.int64)
    rows = np.arange(h)[:, None]
    red = words[rows, (x[None, :] + shift[:, None]) % w]
    blue = words[rows, (x[None, :] + w - shift[:, None]) % w]
    out = (red & U32(0xFF)) | (words & U32(0xFF00FF00)) | (blue & U32(0xFF0000))
    return out.astype("<u4").view(np.uint8).reshape(h, w, 4)
