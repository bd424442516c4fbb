"""``kem publish`` and ``kem keygen``: sign a kernel as an ANS-104 data
item with an Arweave wallet, check it as a node would, post it to a bundler."""

from __future__ import annotations

import argparse
from pathlib import Path

from kem_port.cli.console import CliError, Console
from kem_port.errors import KemError


def add_parser(sub) -> None:
    publish = sub.add_parser(
        "publish",
        help="sign a kernel with an Arweave wallet and post it to a bundler",
        description=(
            "Sign FILE as an ANS-104 data item (RSA-PSS, signature type 1) with an Arweave JWK wallet, "
            "verify it as a node's strict mode will, POST it to BUNDLER/tx and print its id: "
            "the kernel's name for kem_nif:execute_kernel and kem run."
        ),
        epilog="example: kem publish mykernel.wgsl --wallet wallet.json --bundler https://upload.ardrive.io/v1",
    )
    publish.add_argument("file", metavar="FILE", help="the .wgsl kernel to publish")
    publish.add_argument("--wallet", required=True, metavar="JWK.json", help="Arweave wallet (RSA JWK, 4096-bit)")
    publish.add_argument("--bundler", required=True, metavar="URL", help="bundler base URL; the item is POSTed to URL/tx")
    publish.add_argument("--tag", action="append", default=[], metavar="NAME=VALUE", help="an extra tag (repeatable)")
    publish.add_argument("--no-check", action="store_true", help="publish without compiling the kernel first")
    publish.add_argument("--dry-run", action="store_true", help="build and verify the item, print its id, post nothing")
    publish.add_argument("--save", metavar="FILE", help="also write the signed item's bytes here")
    publish.set_defaults(handler=handle_publish)

    keygen = sub.add_parser(
        "keygen",
        help="make a new Arweave wallet (JWK) for publishing",
        description="Generate a 4096-bit RSA Arweave wallet as a JWK file (mode 0600) and print its address.",
    )
    keygen.add_argument("out", metavar="OUT.json", help="where to write the wallet (must not exist)")
    keygen.set_defaults(handler=handle_keygen)


def _tags(pairs: list[str]) -> list[tuple[str, str]]:
    tags = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"--tag {pair!r}: use NAME=VALUE")
        tags.append((name, value))
    return tags


def handle_publish(args: argparse.Namespace, console: Console) -> int:
    from kem_port.arweave import ans104, publish, wallet

    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    if not args.no_check:
        _check_kernel(args.file, console)
    try:
        key = wallet.load_jwk(Path(args.wallet))
        item = ans104.build(key, data, publish.kernel_tags(_tags(args.tag)))
        publish.verify_built(item)
        console.detail(f"item {item.item_id}: {len(item.raw)} bytes, signed by {wallet.address(key)}")
        if args.save:
            Path(args.save).write_bytes(item.raw)
        if not args.dry_run:
            console.progress(f"posting {len(item.raw)} bytes to {args.bundler.rstrip('/')}/tx")
            publish.post_item(args.bundler, item)
    except KemError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        raise CliError(f"{exc.filename or ''}: {exc.strerror}") from None
    print(item.item_id)
    return 0


def _check_kernel(path: str, console: Console) -> None:
    """Refuse to publish what kem would not run: a real compile, as kem check does."""
    from kem_port.api import Runner, gpu_layer
    from kem_port.cli.check_cmd import PLACEHOLDER_PARAMS
    from kem_port.cli.common import open_device, resolve
    
    runner = Runner()
    source = resolve(runner, path, console)
    open_device(runner, console)
    console.progress(f"checking {path} before publishing (--no-check skips)")
    params = PLACEHOLDER_PARAMS if gpu_layer().reflect(source.text).binding(0, 2) is not None else None
    try:
        runner.compile(source, runner.call(source, bytes(4), params=params))
    except KemError as exc:
        raise CliError(f"{path} is not a valid kem kernel, not publishing: {exc.reason}: {exc.detail}") from None


def handle_keygen(args: argparse.Namespace, console: Console) -> int:
    from kem_port.arweave import wallet

    out = Path(args.out)
    console.progress("generating a 4096-bit RSA key")
    try:
        key = wallet.generate()
        wallet.save_jwk(key, out)
    except FileExistsError:
        raise CliError(f"{out} exists; not overwriting a wallet") from None
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror}") from None
    print(wallet.address(key))
    return 0
