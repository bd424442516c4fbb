"""Where ``kem run``'s result goes: a file, a pipe (raw bytes) or a
terminal (a hex dump, never raw bytes); optionally encoded as a PNG."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from kem_port.cli.console import CliError
from kem_port.cli.inputs import pillow

TTY_DUMP_LIMIT = 4096  # bytes shown on a terminal; the rest is counted
ROW = 16


def hex_dump(data: bytes, limit: int = TTY_DUMP_LIMIT) -> str:
    """xxd-style lines: offset, 16 bytes in hex, printable ASCII."""
    lines = []
    for offset in range(0, min(len(data), limit), ROW):
        chunk = data[offset : offset + ROW]
        hexed = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexed:<{ROW * 3 - 1}}  |{text}|")
    if len(data) > limit:
        lines.append(f"... {len(data) - limit} more bytes ({len(data)} in all; -o FILE or a pipe for the raw bytes)")
    if not data:
        lines.append("(empty output)")
    return "\n".join(lines) + "\n"


def encode_png(data: bytes, size: tuple[int, int]) -> bytes:
    width, height = size
    if len(data) != width * height * 4:
        raise CliError(f"--png {width}x{height} needs {width * height * 4} bytes of RGBA output, the kernel gave {len(data)}")
    Image = pillow()
    buf = io.BytesIO()
    Image.frombytes("RGBA", (width, height), data).save(buf, format="PNG")
    return buf.getvalue()


def write_output(data: bytes, path: str | None, is_png: bool) -> str:
    """Write the result; returns where it went (for -v)."""
    if path is not None and path != "-":
        try:
            Path(path).write_bytes(data)
        except OSError as exc:
            raise CliError(f"cannot write {path}: {exc.strerror}") from None
        return path
    if sys.stdout.isatty():
        if is_png:
            raise CliError("not writing a PNG to a terminal: use -o FILE or a pipe")
        sys.stdout.write(hex_dump(data))
        sys.stdout.flush()
        return "terminal (hex dump)"
    sys.stdout.flush()
    fd = sys.stdout.fileno()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    return "stdout"


def write_buffers(out_dir: str | None, output: str | None, results: dict[str, bytes]) -> None:
    """Named buffers that came back (kem run by names, kem chain): each to
    DIR/NAME.bin, one alone to -o or a pipe, several on a terminal as a
    hex dump each; several into one pipe is refused (which one?)."""
    if out_dir is not None:
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in results.items():
            write_output(data, str(folder / f"{name}.bin"), False)
        return
    if len(results) == 1 and (output is not None or not sys.stdout.isatty()):
        write_output(next(iter(results.values())), output, False)
        return
    if not sys.stdout.isatty():
        raise CliError(f"{len(results)} buffers came back ({', '.join(results)}): use --out-dir DIR")
    for name, data in results.items():
        sys.stdout.write(f"{name}: {len(data)} bytes\n")
        write_output(data, None, False)
