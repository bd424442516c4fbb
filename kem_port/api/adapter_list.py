"""Which adapters wgpu sees, and the one kem would pick, and why
(``kem:adapters()``, ``kem adapters``, :func:`kem_port.api.adapters`).

The pick is made by the port's own code (gpu/device.choose_adapter) with the
same KEM_ADAPTER setting; this only matches it against the listing.
"""

from __future__ import annotations

from typing import Any

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


def adapters(config: Config | None = None) -> dict[str, Any]:
    """Every adapter wgpu sees and the one kem would pick, and why, as
    ``kem:adapters()`` and ``kem adapters --json`` give them:
    ``{"adapters": [...], "kem_picks": index or None, "why": text}``."""
    import wgpu

    from kem_port.api.gpu import gpu_layer

    listing = [describe(i, a) for i, a in enumerate(wgpu.gpu.enumerate_adapters_sync())]
    chosen, why = pick(listing, config or Config.from_env(), gpu_layer)
    return {"adapters": listing, "kem_picks": chosen, "why": why}


def pick(adapters: list[dict], config: Config, gpu_layer) -> tuple[int | None, str]:
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
