"""Values at the edge of kem_port.api: numpy arrays and bytes in, params
as u32 words, numpy or bytes out."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from kem_port.errors import bad_args

Input = Union[bytes, bytearray, memoryview, np.ndarray]
Params = Union[bytes, bytearray, Sequence[int], np.ndarray, None]


def file_kernel_id(path: Path) -> str:
    """A kernel id for a file (used in logs and errors): its stem, made legal."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:128] or "kernel"


def input_bytes(value: Input) -> bytes:
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).tobytes()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise bad_args(f"input must be bytes or a numpy array, not {type(value).__name__}")


def params_bytes(value: Params) -> bytes | None:
    """Params as bound: bytes as given, ints as little-endian u32 words."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).tobytes()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    words = list(value)
    if any(not isinstance(w, (int, np.integer)) or not 0 <= int(w) < 1 << 32 for w in words):
        raise bad_args("params words must be integers in 0..2^32-1")
    return np.asarray(words, dtype="<u4").tobytes()


def shape_output(out: bytes, input: Input, dtype: Any) -> np.ndarray | bytes:
    if dtype is None and isinstance(input, np.ndarray):
        dtype = input.dtype
    if dtype is None:
        return out
    dt = np.dtype(dtype)
    if len(out) % dt.itemsize:
        raise bad_args(f"output of {len(out)} bytes is not a whole number of {dt} items; pass dtype=np.uint8 or bytes")
    return np.frombuffer(out, dtype=dt)
