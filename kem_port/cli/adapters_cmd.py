"""``kem adapters``: every adapter wgpu sees, and the one kem would pick, and why.

The listing and the pick are kem_port.api's (api/adapter_list.py), so
``kem:adapters()``, this command and ``api.adapters()`` say the same.
"""

from __future__ import annotations

import argparse
import json

from kem_port.cli.console import CliError, Console
from kem_port.config import Config


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "adapters",
        help="list the adapters wgpu sees and the one kem would use",
        description="List every adapter wgpu sees (type, backend, the limits that bound a kem call) and which one kem would pick, and why.",
    )
    parser.add_argument("--json", action="store_true", help="the listing as JSON on stdout")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, console: Console) -> int:
    from kem_port.api.adapter_list import adapters as listing

    console.progress("asking wgpu for adapters")
    answer = listing(Config.from_env())
    adapters, pick, why = answer["adapters"], answer["kem_picks"], answer["why"]
    if args.json:
        # The listing is the answer, an empty one included: the node reads it
        # (kem_adapters) and logs `why'; a traceback would only reach its console.
        print(json.dumps(answer, indent=2))
        return 0
    _print(adapters, pick, why)
    if pick is None:
        raise CliError(f"kem would find no adapter: {why}")
    return 0


def _print(adapters: list[dict], pick: int | None, why: str) -> None:
    if not adapters:
        print("no adapters (install a Vulkan driver; mesa-vulkan-drivers gives lavapipe, a CPU adapter)")
    for a in adapters:
        mark = "*" if a["index"] == pick else " "
        print(f"{mark} {a['index']}: {a['name']}  [{a['type']}, {a['backend']}]  {a['driver']}")
        limits = a["limits"]
        print(
            f"     storage binding {_mib(limits.get('max-storage-buffer-binding-size'))}, "
            f"buffer {_mib(limits.get('max-buffer-size'))}, "
            f"workgroups/dim {limits.get('max-compute-workgroups-per-dimension')}, "
            f"invocations/group {limits.get('max-compute-invocations-per-workgroup')}, "
            f"uniform {_mib(limits.get('max-uniform-buffer-binding-size'))}, "
            f"timestamps {'yes' if a['timestamp_query'] else 'no'}"
        )
    print(f"kem picks: {pick if pick is not None else 'none'} ({why})")


def _mib(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / (1 << 20):.0f} MiB" if value >= 1 << 20 else f"{value / 1024:.0f} KiB"
