"""``kem run KERNEL --buffer NAME=... --out NAME=BYTES``: any kernel by named
buffers (docs/kernels.md), its returned buffers written by name.

A buffer is ``NAME=@FILE`` (its bytes), ``NAME=hex:HEX`` or
``NAME=random:BYTES`` (seeded by ``--seed``); ``--out NAME=BYTES`` sizes an
output. Returned buffers go to ``--out-dir DIR`` as ``DIR/NAME.bin``, else
to ``-o FILE`` when there is one, else as hex dumps on a terminal.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from kem_port.cli import common, inputs, output
from kem_port.cli.console import CliError, Console
from kem_port.errors import KemError


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--buffer", action="append", type=buffer_spec, metavar="NAME=@FILE|hex:HEX|random:BYTES",
                        help="a buffer by its WGSL name (or G/B): run any kernel by named buffers; repeatable")
    parser.add_argument("--out", action="append", type=out_spec, metavar="NAME=BYTES",
                        help="the size of an output buffer (a read_write buffer not given); repeatable")
    parser.add_argument("--out-dir", metavar="DIR", help="write each returned buffer to DIR/NAME.bin")


def buffer_spec(text: str) -> tuple[str, str, str]:
    """argparse type: NAME=@FILE, NAME=hex:HEX or NAME=random:BYTES."""
    name, sep, value = text.partition("=")
    kind, _, rest = value.partition(":") if not value.startswith("@") else ("@", "", value[1:])
    if not sep or not name or kind not in ("@", "hex", "random") or not rest:
        raise argparse.ArgumentTypeError(f"not NAME=@FILE, NAME=hex:HEX or NAME=random:BYTES: {text!r}")
    return name, kind, rest


def out_spec(text: str) -> tuple[str, int]:
    """argparse type: NAME=BYTES (a size with an optional K/M/G)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"not NAME=BYTES: {text!r}")
    return name, inputs.size(value)


def handle(args: argparse.Namespace, console: Console) -> int:
    from kem_port.api import run_named

    runner = common.runner()
    limit = runner.config.max_input_bytes
    rng = np.random.default_rng(args.seed)
    buffers = {name: _bytes(kind, rest, rng, limit) for name, kind, rest in args.buffer or ()}
    common.resolve(runner, args.kernel, console)
    common.open_device(runner, console)
    console.progress(f"running {args.kernel} by named buffers ({', '.join(buffers) or 'none given'})")
    try:
        got = run_named(args.kernel, buffers, dict(args.out or ()), runner=runner, workgroups=args.workgroups, grid=args.grid,
                        constants=dict(args.constant) if args.constant else None, entry_point=args.entry_point)
    except KemError as exc:
        raise CliError.of(exc) from None
    output.write_buffers(args.out_dir, args.output, {name: array.tobytes() for name, array in got.items()})
    return 0


def _bytes(kind: str, rest: str, rng: np.random.Generator, limit: int) -> bytes:
    if kind == "hex":
        data = inputs.hex_bytes(rest)
    elif kind == "random":
        size = inputs.size(rest)
        inputs.within(size, limit, "random:" + rest)
        data = rng.bytes(size)
    else:
        try:
            path = Path(rest)
            inputs.within(path.stat().st_size, limit, rest)
            data = path.read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {rest}: {exc.strerror}") from None
    return data
