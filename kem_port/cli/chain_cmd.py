"""``kem chain STEPS.json``: a chain (docs/sessions.md) from the shell.

It starts a local port (``python -m kem_port``, the process a node runs),
opens a session there, creates the file's buffers, runs the steps as one
``chain`` request and writes the buffers it returns; so its checks and its
errors are the port's, worded as the Erlang API words them (``step N:
reason: detail`` for a step's failure, as dev_kem's execute_chain says).
The chain file's format: chain_file.py.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from kem_port.cli import chain_file, output
from kem_port.cli.console import CliError, Console, one_line

NOT_STARTED = "the local port did not start"


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "chain",
        help="run a chain of kernel, copy and clear steps on one GPU submission",
        description=(
            "Run the steps of a chain file (JSON: buffers, input, steps, return; docs/sessions.md) in a session "
            "on a local port, and write the buffers it returns: to --out-dir DIR as DIR/NAME.bin, else one "
            "buffer to -o FILE or a pipe, else hex dumps on a terminal."
        ),
        epilog='example: {"buffers": {"a": "random:4K", "b": "zeros:4K"}, "steps": [{"copy": ["a", 0, "b", 0, 4096]}], '
               '"return": ["b"]}',
    )
    parser.add_argument("file", metavar="STEPS.json", help="the chain file")
    parser.add_argument("--seed", type=int, help="seed for random: bytes (default: fresh)")
    parser.add_argument("--out-dir", metavar="DIR", help="write each returned buffer to DIR/NAME.bin")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the one returned buffer here ('-' for stdout)")
    parser.set_defaults(handler=handle, usage_error=parser.error)


def handle(args: argparse.Namespace, console: Console) -> int:
    from kem_port.client import PortClient, PortError
    from kem_port.config import Config

    config = Config.from_env()
    chain = chain_file.read(args.file, np.random.default_rng(args.seed), config.max_input_bytes)
    with tempfile.TemporaryDirectory(prefix="kem-chain-") as kernels:
        env = {"KEM_KERNEL_DIR": _kernel_dir(chain, config.kernel_dir, Path(kernels))} if chain.kernel_files else {}
        console.progress(f"starting a local port for {len(chain.steps)} steps")
        port = PortClient(env)
        try:
            session = port.session_open()
            for name, contents in chain.buffers.items():
                session.create(name, contents)
            result = session.chain(chain.steps, chain.input, chain.returns)
        except PortError as exc:
            raise CliError(_worded(exc)) from None
        except (EOFError, OSError, RuntimeError) as exc:
            raise CliError(f"{NOT_STARTED}: {exc}") from None
        finally:
            port.close()
    output.write_buffers(args.out_dir, args.output, result if isinstance(result, dict) else {"output": result})
    return 0


def _kernel_dir(chain: chain_file.ChainFile, user_dir: Path | None, folder: Path) -> str:
    """One folder the port searches: the chain's .wgsl files by their stems,
    and the user's KEM_KERNEL_DIR kernels beside them."""
    if user_dir is not None and user_dir.is_dir():
        for found in user_dir.glob("*.wgsl"):
            os.symlink(found.resolve(), folder / found.name)
    for kernel_id, path in chain.kernel_files.items():
        if not path.is_file():
            raise CliError(f"cannot read {path}: no such file")
        target = folder / f"{kernel_id}.wgsl"
        target.unlink(missing_ok=True)
        os.symlink(path, target)
    return str(folder)


def _worded(exc) -> str:
    """``step N: reason: detail`` for a step, ``reason: detail`` otherwise."""
    where = f"step {exc.step}: " if exc.step is not None else ""
    return f"{where}{exc.reason}: {one_line(exc.detail)}"
