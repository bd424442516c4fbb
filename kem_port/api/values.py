"""Values at the edge of kem_port.api: numpy arrays and bytes in, params
as u32 words, numpy or bytes out."""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from kem_port.errors import bad_args
from kem_port.wire import terms
from kem_port.wire.protocol import kernel_call

Input = Union[bytes, bytearray, memoryview, np.ndarray]
Params = Union[bytes, bytearray, Sequence[int], np.ndarray, None]


def file_kernel_id(path: Path) -> str:
    """A kernel id for a file (used in logs and errors): its stem, made legal."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:128] or "kernel"


def gpu_order(array: np.ndarray) -> np.ndarray:
    """The array as kem uploads it: C-contiguous and little-endian (the
    GPU's order: a big-endian array's bytes read as its values would be
    silently wrong); an array of Python objects has no bytes to upload
    (its bytes are this process's heap pointers), so it is bad_args."""
    if array.dtype.hasobject:
        raise bad_args("an array of Python objects has no bytes to upload: give numbers (or bytes)")
    if array.dtype.fields is None and array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array)


def asked_dtype(dtype: Any) -> np.dtype:
    """A dtype the caller asked the output in; bad_args for what is not one
    or holds objects."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise bad_args(f"dtype {str(dtype)[:40]!r} is not a numpy dtype") from None
    if dt.hasobject:
        raise bad_args("an output cannot be read as Python objects: ask for a numeric dtype")
    return dt


def from_gpu(data: bytes, dtype: Any) -> np.ndarray:
    """Little-endian bytes from the GPU as an array of `dtype`, by value
    (a big-endian dtype gets its values, swapped into its order)."""
    dt = asked_dtype(dtype)
    if dt.fields is None and dt.byteorder == ">":
        return np.frombuffer(data, dt.newbyteorder("<")).astype(dt)
    return np.frombuffer(data, dt)


def input_bytes(value: Input) -> bytes:
    if isinstance(value, np.ndarray):
        return gpu_order(value).tobytes()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise bad_args(f"input must be bytes or a numpy array, not {type(value).__name__}")


def params_bytes(value: Params) -> bytes | None:
    """Params as bound: bytes as given, ints as little-endian u32 words."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return gpu_order(value).tobytes()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    words = list(value)
    if any(not isinstance(w, (int, np.integer)) or not 0 <= int(w) < 1 << 32 for w in words):
        raise bad_args("params words must be integers in 0..2^32-1")
    return np.asarray(words, dtype="<u4").tobytes()


def shape_output(out: bytes, input: Input, dtype: Any = None, out_shape: Sequence[int] | None = None) -> np.ndarray | bytes:
    """The output as the caller gave the input: bytes for bytes; for an
    array, an array of ``dtype`` (default: the input's), shaped by
    ``out_shape``, else like the input when it has the input's size and
    dtype (an image in, an image out), else flat."""
    if dtype is None and isinstance(input, np.ndarray):
        dtype = input.dtype
    if dtype is None and out_shape is None:
        return out
    dt = asked_dtype(np.uint8 if dtype is None else dtype)
    if len(out) % dt.itemsize:
        raise bad_args(f"output of {len(out)} bytes is not a whole number of {dt} items; pass dtype=np.uint8 or bytes")
    array = from_gpu(out, dt)
    if out_shape is not None:
        try:
            shape = tuple(operator.index(d) for d in out_shape)
        except TypeError:
            raise bad_args(f"out_shape must be a sequence of integers, not {str(out_shape)[:40]!r}") from None
        if int(np.prod(shape, dtype=np.int64)) != array.size:
            raise bad_args(f"out_shape {shape} holds {int(np.prod(shape, dtype=np.int64))} items; the output has {array.size} of {dt}")
        return array.reshape(shape)
    if isinstance(input, np.ndarray) and input.ndim > 1 and dt == input.dtype and array.size == input.size:
        return array.reshape(input.shape)
    return array


def array_of(data: bytes, dtype: Any = None, shape: Sequence[int] | None = None) -> np.ndarray:
    """Bytes read back as an array: ``dtype`` (default u8), reshaped when
    ``shape`` is given (KemError bad_args when the sizes disagree)."""
    out = shape_output(data, b"", np.uint8 if dtype is None else dtype, shape)
    assert isinstance(out, np.ndarray)
    return out


def checked_call(config: Any, kernel_id: str, data: bytes, *, output_size: int | None, hint: int, params: bytes | None,
                 workgroups: Sequence[int] | None, entry_point: str, debug: bool, grid: Sequence[int] | None,
                 constants: Mapping[str, int | float] | None, gas_limit: int | None = None) -> Any:
    """A KernelCall checked by the port's own rules (protocol.kernel_call), from
    Python values; it answers its gas (``usage``: the API reports every call's)."""
    atom = terms.atom
    opts: dict[Any, Any] = {atom("entry_point"): terms.Binary(entry_point.encode()), atom("debug"): debug, atom("usage"): True}
    if gas_limit is not None:
        opts[atom("gas_limit")] = gas_limit
    if output_size is not None:
        opts[atom("output_size")] = operator.index(output_size)
    else:
        opts[atom("output_size_hint")] = operator.index(hint)
    if params is not None:
        opts[atom("params")] = terms.Binary(params)
    if workgroups is not None:
        opts[atom("workgroups")] = tuple(operator.index(g) for g in workgroups)
    if grid is not None:
        opts[atom("grid")] = tuple(operator.index(g) for g in grid)
    if constants is not None:
        opts[atom("constants")] = {terms.Binary(str(k).encode()): v for k, v in constants.items()}
    return kernel_call("execute", (terms.Binary(kernel_id.encode()), terms.Binary(data), opts), config)
