#!/usr/bin/env python3
"""Write raw RGBA8 files as PNGs (Pillow). Usage: rgba_to_png.py W H FILE.rgba..."""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image


def main(argv: list[str]) -> int:
    width, height, files = int(argv[1]), int(argv[2]), argv[3:]
    for name in files:
        raw = Path(name)
        png = raw.with_suffix(".png")
        Image.frombytes("RGBA", (width, height), raw.read_bytes()).save(png)
        raw.unlink()
        print(f"kem demo: wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
