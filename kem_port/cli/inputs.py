"""Where ``kem run``'s input and params come from: a file (a PNG decoded to
RGBA), hex, or seeded random bytes; params as u32 words or hex."""

from __future__ import annotations

import argparse
import io
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kem_port.cli.console import CliError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Loaded:
    data: bytes
    image_size: tuple[int, int] | None = None  # (width, height) of a PNG input


def hex_bytes(text: str) -> bytes:
    """argparse type: hex digits, spaces, colons and a 0x prefix allowed."""
    cleaned = text.strip().removeprefix("0x").replace(" ", "").replace(":", "")
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not hex: {text[:40]!r}") from None


def size(text: str) -> int:
    """argparse type: a byte count, with an optional K/M/G (binary) suffix."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64K, 16M)")
    return int(digits) * scale


def triple(text: str) -> tuple[int, int, int]:
    """argparse type: X,Y,Z workgroup counts (Y and Z default to 1)."""
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"not X,Y,Z of positive integers: {text!r}")
    counts = [int(p) for p in parts] + [1] * (3 - len(parts))
    return counts[0], counts[1], counts[2]


def constant(text: str) -> tuple[str, int | float]:
    """argparse type: NAME=VALUE, an integer (decimal or 0x hex) or a float."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {text!r}")
    try:
        number: int | float = int(value, 0)
    except ValueError:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: not a number: {value!r}") from None
    return name, number


def image_size(text: str) -> tuple[int, int]:
    """argparse type: WxH."""
    w, sep, h = text.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit() or int(w) == 0 or int(h) == 0:
        raise argparse.ArgumentTypeError(f"not WxH: {text!r} (e.g. 640x480)")
    return int(w), int(h)


def load_input(args: argparse.Namespace, limit: int) -> Loaded:
    """The input bytes from --input, --hex or --random; sizes are held to
    `limit` (KEM_MAX_INPUT_BYTES) before anything that large is made."""
    if args.hex is not None:
        return Loaded(args.hex)
    if args.random is not None:
        within(args.random, limit, "--random")
        return Loaded(np.random.default_rng(args.seed).bytes(args.random))
    try:
        if args.input == "-":
            raw = sys.stdin.buffer.read(limit + 1)
        else:
            path = Path(args.input)
            within(path.stat().st_size, limit, args.input)
            raw = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.input}: {exc.strerror}") from None
    within(len(raw), limit, args.input)
    if raw.startswith(PNG_MAGIC) and not args.raw:
        return _decode_png(raw, args.input, limit)
    return Loaded(raw)


def within(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise CliError(f"too_large: {what} is over KEM_MAX_INPUT_BYTES={limit}" + ("" if what == "-" else f" ({size} bytes)"))


def _decode_png(raw: bytes, name: str, limit: int) -> Loaded:
    """A PNG becomes RGBA8 pixels, row-major: one u32 word a pixel, as the
    image kernels expect. Its RGBA size is checked from the header before
    decoding: a 17.5 KB PNG of 12000 x 12000 one-bit pixels is 576 MB as
    RGBA (1.8 GB at the peak) and was decoded before any limit."""
    Image = pillow()
    try:
        with warnings.catch_warnings():  # Pillow's bomb warning: the size check below is ours
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw))
        with img:
            within(img.width * img.height * 4, limit, f"{name} as RGBA ({img.width} x {img.height} pixels)")
            rgba = img.convert("RGBA")
    except CliError:
        raise
    except Image.DecompressionBombError:  # past Pillow's own pixel limit, refused at open
        raise CliError(f"too_large: {name} as RGBA is over KEM_MAX_INPUT_BYTES={limit}") from None
    except Exception as exc:  # Pillow raises several types for a bad file
        raise CliError(f"{name}: not a readable PNG ({exc})") from None
    return Loaded(rgba.tobytes(), rgba.size)


def pillow():
    try:
        from PIL import Image
    except ImportError:
        raise CliError("PNG input/output needs Pillow: pip install Pillow") from None
    return Image


def parse_params(words: str | None, raw: bytes | None, image: tuple[int, int] | None) -> bytes | None:
    """--params as comma-separated u32 words (decimal or 0x hex; ``w`` and
    ``h`` stand for a PNG input's width and height), or --params-hex bytes."""
    if raw is not None:
        return raw
    if words is None:
        return None
    values = []
    for token in (t.strip().lower() for t in words.split(",")):
        if token in ("w", "h"):
            if image is None:
                raise CliError(f"--params uses {token!r}, which needs a PNG --input")
            values.append(image[0] if token == "w" else image[1])
            continue
        try:
            value = int(token, 0)
        except ValueError:
            raise CliError(f"--params: {token!r} is not a u32 word (decimal, 0x hex, w or h)") from None
        if not 0 <= value < 1 << 32:
            raise CliError(f"--params: {value} does not fit in 32 bits")
        values.append(value)
    return np.asarray(values, dtype="<u4").tobytes()
