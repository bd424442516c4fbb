"""The ``kem`` command: run, check and publish kernels from the shell.

No Erlang needed: ``kem run`` drives the same executor and kernel resolver
the port uses (through kem_port.api), so what runs here runs in a node.
Exit codes: 0 ok; 1 a kernel, input or network error (one line on stderr);
2 bad command-line usage (argparse).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from kem_port.port import runtime_dir
from kem_port.cli import adapters_cmd, chain_cmd, check_cmd, playground_cmd, publish_cmd, run_cmd
from kem_port.cli.console import Console, CliError

COMMANDS = (run_cmd, check_cmd, chain_cmd, adapters_cmd, publish_cmd, playground_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kem",
        description="Run, check and publish kem compute kernels (WGSL) without a node.",
        epilog="Settings come from the same KEM_* environment variables as the port (README: Settings).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="timings and adapter on stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # kem run --warm hands the command on as typed
    runtime_dir.ensure()  # before a driver loads: no Mesa XDG_RUNTIME_DIR notice
    console = Console(verbose=args.verbose, quiet=args.quiet)
    try:
        _log_to_stderr(os.environ.get("KEM_LOG", "WARNING"))
        return args.handler(args, console)
    except CliError as exc:
        console.fail(str(exc))
        return 1
    except BrokenPipeError:
        # The reader left (`kem run ... | head -c 16`): nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        console.fail("interrupted")
        return 130


def _log_to_stderr(level: str) -> None:
    """The port's own warnings (e.g. KEM_VERIFY=off fetches) reach the user."""
    if not isinstance(logging.getLevelName(level.upper()), int):
        raise CliError(f"KEM_LOG={level!r} is not a log level (DEBUG, INFO, WARNING, ERROR)")
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="kem: %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(level.upper()) >= logging.WARNING:
        # The guard's "kernel ... refused" warning is for a port's operator;
        # here the command's own error line says it (one line, exit 1).
        logging.getLogger("kem_port.admission.guard").setLevel(logging.ERROR)


if __name__ == "__main__":
    raise SystemExit(main())
