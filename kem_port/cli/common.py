"""Options and steps shared by ``kem run`` and ``kem check``."""

from __future__ import annotations

import argparse

from kem_port.cli import inputs
from kem_port.cli.console import CliError, Console
from kem_port.errors import KemError

_warm_runner = None  # the warm process's one Runner (kem_port/warm/server.py); None in a plain command


def use_warm_runner(runner) -> None:
    global _warm_runner
    _warm_runner = runner


def in_warm_process() -> bool:
    return _warm_runner is not None


def runner():
    """The Runner a command uses: a fresh one, or in the warm process its
    shared one (one device and its compiled pipelines for every command)."""
    if _warm_runner is not None:
        return _warm_runner
    from kem_port.api import Runner

    return Runner()


def add_call_options(parser: argparse.ArgumentParser) -> None:
    """How a call is shaped: output size, params, workgroups or grid, constants, entry point."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--hint", type=int, default=1, metavar="N", help="output = input size x N (default 1)")
    size.add_argument("--output-size", type=inputs.size, metavar="BYTES", help="exact output size (e.g. 4096, 64K)")
    params = parser.add_mutually_exclusive_group()
    params.add_argument(
        "--params", metavar="WORDS",
        help="uniform params as comma-separated u32 words: decimal, 0x hex, or w/h for a PNG input's size",
    )
    params.add_argument("--params-hex", type=inputs.hex_bytes, metavar="HEX", help="uniform params as raw hex bytes")
    dispatch = parser.add_mutually_exclusive_group()
    dispatch.add_argument("--workgroups", type=inputs.triple, metavar="X,Y,Z", help="override kem's dispatch rule")
    dispatch.add_argument("--grid", type=inputs.triple, metavar="X,Y,Z",
                          help="invocations; kem divides by the workgroup size, rounding up")
    parser.add_argument("--constant", type=inputs.constant, action="append", metavar="NAME=VALUE",
                        help="a pipeline-overridable constant (an override in the kernel); repeatable")
    parser.add_argument("--entry-point", default="main", metavar="NAME", help="the @compute function (default main)")


def resolve(runner, kernel: str, console: Console):
    """The kernel's source, saying so when it has to come from a gateway."""
    try:
        if not any(c in kernel for c in "./") and runner.resolver.resolve_local(kernel) is None:
            if runner.resolver.needs_fetch(kernel):
                console.progress(f"fetching {kernel} from {', '.join(runner.config.gateways)} (KEM_VERIFY={runner.config.verify})")
        return runner.source(kernel)
    except KemError as exc:
        raise CliError.of(exc) from None


def open_device(runner, console: Console) -> None:
    if not in_warm_process():  # the warm process opened its device when it started
        console.progress("opening the GPU device")
    try:
        executor = runner.executor
    except KemError as exc:
        raise CliError.of(exc) from None
    info = executor.info
    console.detail(f"adapter: {info.get('name')} ({info.get('adapter_type')}, {info.get('backend')})")
