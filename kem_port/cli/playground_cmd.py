"""``kem playground``: the kernel authors' page (docs/playground.md), served
on this machine only, one device kept warm for the server's life."""

from __future__ import annotations

import argparse
import signal
import sys

from kem_port.cli.console import CliError, Console
from kem_port.errors import KemError


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "playground",
        help="a local page to edit, check and run a kernel",
        description=(
            "Serve the kernel playground on 127.0.0.1: a WGSL editor checked as you type, inputs from a PNG, "
            "a file or random bytes, Run, the output as an image or hex, the dispatch rule, GPU time and debug "
            "records. Publishing stays in `kem publish`."
        ),
        epilog="example: kem playground --port 8765, then open the URL it prints",
    )
    from kem_port.playground.server import DEFAULT_HOST

    parser.add_argument("--host", default=DEFAULT_HOST, metavar="ADDR", help="a loopback address to bind (default 127.0.0.1; others are refused)")
    parser.add_argument("--port", type=_port, default=0, metavar="N", help="the port (default: a free one)")
    parser.set_defaults(handler=handle)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}")
    return int(text)


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt


def handle(args: argparse.Namespace, console: Console) -> int:
    from kem_port.playground.bench import Bench
    from kem_port.playground.server import PlaygroundServer, loopback

    if not loopback(args.host):
        raise CliError(f"the playground serves this machine only: --host {args.host} is not a loopback address (127.x.x.x)")
    bench = Bench()
    try:
        server = PlaygroundServer(args.host, args.port, bench)
    except (KemError, OSError) as exc:
        bench.close()
        raise CliError(f"cannot serve on {args.host}:{args.port}: {getattr(exc, 'detail', None) or exc.strerror}") from None
    # SIGTERM stops it as Ctrl-C does: the same clean shutdown (tests, service managers).
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"kem playground: {server.url}  (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        bench.close()
    print("kem playground: stopped", file=sys.stderr, flush=True)
    return 0
