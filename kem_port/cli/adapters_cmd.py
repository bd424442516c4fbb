"""``kem adapters``: every adapter wgpu sees, and the one kem would pick, and why.

The pick is made by the port's own code (gpu/device.choose_adapter) with the
same KEM_ADAPTER setting; this only matches it against the listing.
"""

from __future__ import annotations

import argparse
import json

from kem_port.cli.console import CliError, Console
from kem_port.config import Config
from kem_port.errors import KemError

LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroups-per-dimension",
    "max-compute-invocations-per-workgroup",
    "max-uniform-buffer-binding-size",
)
IDENTITY = ("device", "vendor_id", "device_id", "backend_type", "adapter_type")


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "adapters",
        help="list the adapters wgpu sees and the one kem would use",
        description="List every adapter wgpu sees (type, backend, the limits that bound a kem call) and which one kem would pick, and why.",
    )
    parser.add_argument("--json", action="store_true", help="the listing as JSON on stdout")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, console: Console) -> int:
    import wgpu

    from kem_port.api import gpu_layer

    config = Config.from_env()
    console.progress("asking wgpu for adapters")
    adapters = [describe(i, a) for i, a in enumerate(wgpu.gpu.enumerate_adapters_sync())]
    pick, why = _pick(adapters, config, gpu_layer)
    if args.json:
        # The listing is the answer, an empty one included: the node reads it
        # (kem_adapters) and logs `why'; a traceback would only reach its console.
        print(json.dumps({"adapters": adapters, "kem_picks": pick, "why": why}, indent=2))
        return 0
    _print(adapters, pick, why)
    if pick is None:
        raise CliError(f"kem would find no adapter: {why}")
    return 0


def _pick(adapters: list[dict], config: Config, gpu_layer) -> tuple[int | None, str]:
    """The index kem's own choice lands on, and why; (None, why) when none."""
    if not adapters:
        # wgpu's request_adapter raises a bare RuntimeError then: say it plainly.
        return None, "no_adapter: wgpu found no adapter (install a Vulkan driver; mesa-vulkan-drivers gives lavapipe, a CPU adapter)"
    try:
        chosen = gpu_layer().choose_adapter(config.adapter)
    except KemError as exc:
        return None, f"{exc.reason}: {exc.detail}"
    except RuntimeError as exc:  # wgpu's "Request adapter failed"
        return None, f"no_adapter: {str(exc).splitlines()[0]}"
    return _match(adapters, chosen.info), _reason(config, chosen.info)


def describe(index: int, adapter) -> dict:
    info, limits = adapter.info, adapter.limits
    return {
        "index": index,
        "name": info.get("device", ""),
        "type": info.get("adapter_type", ""),
        "backend": info.get("backend_type", ""),
        "vendor": info.get("vendor", ""),
        "driver": info.get("description", ""),
        "identity": {k: info.get(k) for k in IDENTITY},
        "timestamp_query": "timestamp-query" in adapter.features,
        "limits": {k: int(limits[k]) for k in LIMITS if k in limits},
    }


def _match(adapters: list[dict], info) -> int | None:
    wanted = {k: info.get(k) for k in IDENTITY}
    return next((a["index"] for a in adapters if a["identity"] == wanted), None)


def _reason(config: Config, info) -> str:
    if config.adapter:
        return f"KEM_ADAPTER={config.adapter!r} selects it (by {'index' if config.adapter.isdigit() else 'name'})"
    why = "no KEM_ADAPTER: wgpu's high-performance choice"
    if info.get("adapter_type") == "CPU":
        why += "; it is a CPU adapter (no GPU adapter available): kernels run, slowly, on the CPU"
    return why


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
