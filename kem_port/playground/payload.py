"""The page's JSON requests read once into typed values, every field
checked (type, range, size) before anything is made from it; a bad field is
``bad_args`` and a size past the port's own limits ``too_large``.

Inputs are ``{"kind": "random", "size": N, "seed": S}``, ``{"kind":
"hex", "text": "..."}`` or ``{"kind": "file", "data": BASE64, "png":
bool}`` (a PNG decoded to RGBA, as ``kem run --input`` decodes it).
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kem_port.errors import KemError, bad_args, too_large

MAX_CODE = 1 << 20  # characters of kernel text: 1 MiB, the largest kernel the tests compile
MAX_NAMES = 16  # named buffers or constants in one request (a kernel binds at most 16 per group)


@dataclass(frozen=True)
class Loaded:
    data: bytes
    image_size: tuple[int, int] | None = None  # (width, height) of a PNG input


@dataclass(frozen=True)
class Shape:
    """How a call is shaped: the fields of ``kem check``'s and ``kem run``'s call options."""

    entry_point: str = "main"
    output_size: int | None = None
    hint: int = 1
    params: str | None = None  # u32 words "1,2,0x3" (w/h: a PNG input's size)
    workgroups: tuple[int, int, int] | None = None
    grid: tuple[int, int, int] | None = None
    constant: list[tuple[str, int | float]] = field(default_factory=list)


def code(body: dict) -> str:
    text = body.get("code")
    if not isinstance(text, str) or not text.strip():
        raise bad_args("code: the kernel's WGSL text is required")
    if len(text) > MAX_CODE:
        raise too_large(f"code: {len(text)} characters, over the playground's {MAX_CODE}")
    return text


def shape(body: dict, limit: int) -> Shape:
    grid, workgroups = _triple(body, "grid"), _triple(body, "workgroups")
    if grid and workgroups:
        raise bad_args("give grid or workgroups, not both")
    params = body.get("params")
    if params is not None and (not isinstance(params, str) or len(params) > 4096):
        raise bad_args("params: comma-separated u32 words as text")
    constants = body.get("constants") or {}
    if not isinstance(constants, dict) or len(constants) > MAX_NAMES or not all(
            isinstance(k, str) and _number(v) for k, v in constants.items()):
        raise bad_args(f"constants: an object of at most {MAX_NAMES} names to numbers")
    output_size = body.get("output_size")
    if output_size is not None:
        output_size = _count(output_size, "output_size", limit)
    entry = body.get("entry_point") or "main"
    if not isinstance(entry, str) or len(entry) > 128:
        raise bad_args("entry_point: a function name")
    hint = _count(body.get("hint", 1), "hint", 1 << 16)
    return Shape(entry, output_size, max(hint, 1), params or None, workgroups, grid, sorted(constants.items()))


def load(spec: Any, limit: int, what: str) -> Loaded:
    """One input's bytes; sizes held to ``limit`` (KEM_MAX_INPUT_BYTES) before they are made."""
    if not isinstance(spec, dict):
        raise bad_args(f"{what}: an input is an object with a kind")
    kind = spec.get("kind")
    if kind == "random":
        size = _count(spec.get("size"), f"{what}.size", limit)
        seed = spec.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 63):
            raise bad_args(f"{what}.seed: a non-negative integer")
        return Loaded(np.random.default_rng(seed).bytes(size))  # the same bytes as `kem run --random N --seed S`
    if kind == "hex":
        text = spec.get("text")
        if not isinstance(text, str) or len(text) > 2 * limit + 1024:
            raise bad_args(f"{what}.text: hex digits")
        try:
            return Loaded(bytes.fromhex(text.strip().removeprefix("0x").replace(" ", "").replace(":", "")))
        except ValueError:
            raise bad_args(f"{what}.text: not hex") from None
    if kind == "file":
        data = _base64(spec.get("data"), what, limit)
        return _png(data, what, limit) if spec.get("png") else Loaded(data)
    raise bad_args(f"{what}.kind: random, hex or file")


def params_bytes(words: str | None, image: tuple[int, int] | None) -> bytes | None:
    """Params text as ``kem run --params`` reads it (w and h: a PNG input's size)."""
    if words is None:
        return None
    values = []
    for token in (t.strip().lower() for t in words.split(",") if t.strip()):
        if token in ("w", "h"):
            if image is None:
                raise bad_args(f"params: {token!r} needs a PNG input")
            values.append(image[0] if token == "w" else image[1])
            continue
        try:
            value = int(token, 0)
        except ValueError:
            raise bad_args(f"params: {token!r} is not a u32 word (decimal, 0x hex, w or h)") from None
        if not 0 <= value < 1 << 32:
            raise bad_args(f"params: {value} does not fit in 32 bits")
        values.append(value)
    return np.asarray(values, dtype="<u4").tobytes()


def named(body: dict, limit: int) -> tuple[dict[str, Loaded], dict[str, int]]:
    """Named buffers' inputs and outputs' sizes, by WGSL name."""
    buffers, outputs = body.get("buffers") or {}, body.get("outputs") or {}
    if not isinstance(buffers, dict) or not isinstance(outputs, dict) or len(buffers) + len(outputs) > MAX_NAMES:
        raise bad_args(f"buffers and outputs: objects of at most {MAX_NAMES} names in all")
    # The sizes the specs declare, summed before any is made: each alone
    # within the limit, 16 random inputs of 200 MiB made 3.2 GB before the
    # total was checked.
    declared = sum(_declared(spec) for spec in buffers.values())
    if declared > limit:
        raise too_large(f"buffers: {declared} bytes in all, over KEM_MAX_INPUT_BYTES={limit}")
    loaded = {_name(n): load(spec, limit, f"buffers.{n}") for n, spec in buffers.items()}
    total = sum(len(v.data) for v in loaded.values())
    if total > limit:
        raise too_large(f"buffers: {total} bytes in all, over KEM_MAX_INPUT_BYTES={limit}")
    return loaded, {_name(n): _count(size, f"outputs.{n}", limit) for n, size in outputs.items()}


def _declared(spec: Any) -> int:
    """The bytes an input spec will make, from its fields alone (0 where
    load() will refuse it; a PNG's RGBA size is checked when it is read)."""
    if not isinstance(spec, dict):
        return 0
    kind = spec.get("kind")
    if kind == "random":
        size = spec.get("size")
        return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0
    text = spec.get("text") if kind == "hex" else spec.get("data") if kind == "file" else None
    if not isinstance(text, str):
        return 0
    return len(text) // 2 if kind == "hex" else len(text) // 4 * 3


def _png(data: bytes, what: str, limit: int) -> Loaded:
    try:
        from PIL import Image
    except ImportError:
        raise KemError("bad_args", "PNG inputs need Pillow (pip install Pillow)") from None
    try:
        with warnings.catch_warnings():  # Pillow's bomb warning: the size check below is ours
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:  # over twice Pillow's own pixel limit: refused at open
        raise too_large(f"{what}: a PNG over KEM_MAX_INPUT_BYTES={limit} as RGBA") from None
    except Exception:  # Pillow raises several types for a bad file
        raise bad_args(f"{what}: not a readable PNG") from None
    try:
        with img:
            # Its RGBA size before decoding: a 17.5 KB PNG of 12000 x 12000
            # one-bit pixels decoded to 576 MB (1.8 GB at the peak) before
            # any limit was checked.
            if img.width * img.height * 4 > limit:
                raise too_large(f"{what}: a {img.width} x {img.height} PNG is {img.width * img.height * 4} bytes as RGBA, "
                                f"over KEM_MAX_INPUT_BYTES={limit}")
            rgba = img.convert("RGBA")
    except KemError:
        raise
    except Exception:  # Pillow raises several types for a bad file
        raise bad_args(f"{what}: not a readable PNG") from None
    return Loaded(rgba.tobytes(), rgba.size)  # one u32 word a pixel, row-major, as the image kernels expect


def _base64(value: Any, what: str, limit: int) -> bytes:
    if not isinstance(value, str):
        raise bad_args(f"{what}.data: the file's bytes in base64")
    if len(value) > (limit // 3 + 1) * 4:
        raise too_large(f"{what}: over KEM_MAX_INPUT_BYTES={limit}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise bad_args(f"{what}.data: not base64") from None


def _triple(body: dict, name: str) -> tuple[int, int, int] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 32 for v in value):
        raise bad_args(f"{name}: one to three positive integers")
    counts = list(value) + [1] * (3 - len(value))
    return counts[0], counts[1], counts[2]


def _count(value: Any, what: str, limit: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad_args(f"{what}: a non-negative integer")
    if value > limit:
        raise too_large(f"{what}: {value}, over {limit}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _name(name: str) -> str:
    if not name or len(name) > 128:
        raise bad_args("a buffer's name: its WGSL name or G/B")
    return name
