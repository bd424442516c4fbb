"""``kem run KERNEL``: run a kernel once on input from a file, hex or random bytes."""

from __future__ import annotations

import argparse
import sys

from kem_port.cli import common, inputs, output, run_named
from kem_port.cli.console import CliError, Console
from kem_port.errors import KemError


# Options of the plain call that a call by named buffers has no place for.
_PLAIN_ONLY = (("debug", "--debug"), ("gas_limit", "--gas-limit"), ("params", "--params"), ("params_hex", "--params-hex"),
               ("output_size", "--output-size"), ("png", "--png"), ("raw", "--raw"))


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "run",
        help="run a kernel (a .wgsl file or a kernel id) once",
        description=(
            "Run a kernel once and write its output: raw bytes to -o FILE or a pipe, "
            "a hex dump on a terminal. KERNEL is a .wgsl path or a kernel id "
            "(KEM_KERNEL_DIR, the packaged examples, or an Arweave ID fetched and "
            "verified as the port does)."
        ),
        epilog="examples: kem run double --random 64K --seed 1 -o out.bin; "
               "kem run add.wgsl --buffer a=@a.bin --buffer b=random:4K --out c=4K --grid 1024 --out-dir out/",
    )
    parser.add_argument("kernel", metavar="KERNEL", help="a .wgsl file or a kernel id (an id starting with '-': put it after '--')")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input", metavar="FILE", help="input bytes from FILE ('-' for stdin); a PNG is decoded to RGBA")
    source.add_argument("--hex", type=inputs.hex_bytes, metavar="HEX", help="input bytes as hex")
    source.add_argument("--random", type=inputs.size, metavar="BYTES", help="this many random input bytes")
    parser.add_argument("--seed", type=int, help="seed for --random (default: fresh)")
    parser.add_argument("--raw", action="store_true", help="pass a PNG --input through as bytes, undecoded")
    common.add_call_options(parser)
    run_named.add_options(parser)
    parser.add_argument("-o", "--output", metavar="FILE", help="write the output here ('-' for stdout)")
    parser.add_argument("--warm", action="store_true",
                        help="run in the warm kem process (started on first use, ends after 10 idle minutes): "
                             "a second run skips the device open and the compile (docs/cli.md)")
    parser.add_argument("--debug", action="store_true", help="bind the kernel's debug channel and print its records on stderr (docs/debug.md)")
    parser.add_argument("--gas-limit", type=_gas_limit, metavar="N",
                        help="the call's gas budget: invocations launched + loop iterations (docs/metering.md); "
                             "default KEM_GAS_LIMIT; -v prints the gas used")
    parser.add_argument(
        "--png", nargs="?", const="input", type=_png_size, metavar="WxH",
        help="encode the RGBA output as a PNG of WxH pixels (default: the PNG input's size)",
    )
    parser.set_defaults(handler=handle, usage_error=parser.error)


def _gas_limit(text: str) -> int:
    """A positive integer below 2^63 (the port's bound), said as argparse says a bad value."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 1 << 63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a gas limit (an integer 1..2^63-1)")
    return value


def _png_size(text: str):
    return "input" if text == "input" else inputs.image_size(text)


def handle(args: argparse.Namespace, console: Console) -> int:
    if args.warm and not common.in_warm_process():
        from kem_port.warm.client import forward

        return forward(args.argv, console)
    if args.buffer or args.out:  # any kernel by named buffers (run_named.py)
        if args.input is not None or args.hex is not None or args.random is not None:
            args.usage_error("give the input as --input/--hex/--random, or the buffers by name (--buffer/--out), not both")
        # Said, not ignored: --debug by named buffers ran without its channel and exited 0.
        unused = [flag for attr, flag in _PLAIN_ONLY if getattr(args, attr)] + (["--hint"] if args.hint != 1 else [])
        if unused:
            args.usage_error(f"{', '.join(unused)}: only for a call with --input/--hex/--random; by named buffers a "
                             "uniform is a --buffer NAME=..., an output's size an --out NAME=BYTES, and no debug channel is bound")
        return run_named.handle(args, console)
    if args.input is None and args.hex is None and args.random is None:
        args.usage_error("give an input (--input, --hex or --random), or buffers by name (--buffer NAME=..., --out NAME=BYTES)")
    runner = common.runner()
    loaded = inputs.load_input(args, runner.config.max_input_bytes)
    params = inputs.parse_params(args.params, args.params_hex, loaded.image_size)
    png_size = _png_target(args.png, loaded)
    source = common.resolve(runner, args.kernel, console)
    common.open_device(runner, console)
    try:
        call = runner.call(
            source, loaded.data, output_size=args.output_size, hint=args.hint, params=params,
            workgroups=args.workgroups, entry_point=args.entry_point, debug=args.debug,
            grid=args.grid, constants=dict(args.constant) if args.constant else None, gas_limit=args.gas_limit,
        )
        if not runner.executor.is_warm(source, call):
            console.progress(f"compiling {source.kernel_id}")
        runner.compile(source, call)
        console.progress(f"running {source.kernel_id} on {len(loaded.data)} bytes")
        result = runner.execute(source, call) if not args.debug else _debug(runner.execute_debug(source, call))
    except KemError as exc:
        raise CliError.of(exc) from None
    data = output.encode_png(result, png_size) if png_size else result
    where = output.write_output(data, args.output, png_size is not None)
    for line in runner.timings.lines():
        console.detail(line)
    if runner.gas is not None:
        console.detail(f"gas: {runner.gas}")
    console.detail(f"{len(result)} bytes out to {where}")
    return 0


def _debug(answer: tuple[bytes, dict]) -> bytes:
    """Print the debug channel's records (always, not only with -v): asked for."""
    result, debug = answer
    records = " ".join(str(r) for r in debug["records"])
    print(f"kem: debug: {len(debug['records'])} records, {debug['dropped']} dropped: {records}", file=sys.stderr, flush=True)
    return result


def _png_target(png, loaded: inputs.Loaded):
    if png != "input":
        return png
    if loaded.image_size is None:
        raise CliError("--png without WxH needs a PNG --input to take the size from")
    return loaded.image_size
