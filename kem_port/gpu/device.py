"""One GPU adapter and its device: choosing, opening, rebuilding, limits.

A :class:`Device` holds every wgpu object tied to one adapter's device
(the buffer pool, the timestamp sampler); nothing lives in module globals,
so a process can hold one per GPU.
"""

from __future__ import annotations

import json
import logging
import time

import wgpu

from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu import gas_meter, hot_path, timing
from kem_port.gpu.buffer_pool import BufferPool
from kem_port.gpu.dispatch import DispatchLimits
from kem_port.stats import Stats

log = logging.getLogger("kem_port.gpu.device")

STAGING_ALIGN = 256
DEFAULT_SPIN_S = 0.002  # well under the ~10 ms a late blocking wait costs
# A lone call on a CPU adapter spins this long before blocking: its wait is
# the one thing the port does then, and lavapipe's blocking wait costs a
# wake-up; but a spin that outlasts the work takes a core from lavapipe's
# own threads. One process on the 2-core dev machine, interleaved against
# main's code (p50/p99 us, two runs): main 114/286 and 187/333; no spin
# 105/267 and 174/308; 100 us 101/288 and 148/333; 200 us 100/408 and
# 147/411; 500 us 104/733 and 150/709 (the spin starves the driver when the
# machine is loaded). 100 us keeps the p50 gain and the tail.
LONE_SPIN_CPU_S = 0.0001
LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroups-per-dimension",
    "max-uniform-buffer-binding-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
)


def choose_adapter(selector: str | None) -> wgpu.GPUAdapter:
    """KEM_ADAPTER picks by index or name substring; else high-performance, else any."""
    if selector:
        adapters = wgpu.gpu.enumerate_adapters_sync()
        if selector.isdigit():
            index = int(selector)
            if index < len(adapters):
                return adapters[index]
        else:
            wanted = selector.lower()
            for adapter in adapters:
                info = adapter.info
                names = " ".join(str(info.get(k, "")) for k in ("device", "description", "vendor", "adapter_type"))
                if wanted in names.lower():
                    return adapter
        listing = "; ".join(f"{i}: {a.info.get('device')}" for i, a in enumerate(adapters))
        raise KemError("no_adapter", f"KEM_ADAPTER={selector!r} matches none of: {listing or 'no adapters'}")
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        adapter = wgpu.gpu.request_adapter_sync(force_fallback_adapter=True)
    if adapter is None:
        raise KemError("no_adapter", "wgpu found no adapter (install mesa-vulkan-drivers for a CPU adapter)")
    return adapter


class Device:
    def __init__(self, config: Config, stats: Stats) -> None:
        self.config = config
        self.stats = stats
        self.adapter: wgpu.GPUAdapter | None = None
        self.device: wgpu.GPUDevice | None = None
        self.pool: BufferPool | None = None
        self.timer = timing.Sampler(None, config.gpu_timing)
        self.binding_limit = 0
        self.uniform_limit = 0
        self.dispatch_limits = DispatchLimits()
        self.storage_align = STAGING_ALIGN
        self.uniform_align = STAGING_ALIGN
        self.gas_turns = gas_meter.TURNS_DEFAULT  # the loop-turn ceiling of this device's calls, set at open
        self.spin_s = 0.0
        self.lone_spin_s = 0.0  # for a call the reader runs alone (gpu_loop.run_inline)
        self._hot: hot_path.HotPath | None = None  # the batch's native calls, built on first use
        self.info: dict = {}

    def open(self) -> None:
        started = time.perf_counter()
        self.adapter = choose_adapter(self.config.adapter)
        self.gas_turns = gas_meter.turns_for(self.config.gas_turns, self.adapter.info.get("adapter_type") == "CPU")
        limits = self.adapter.limits
        wanted = {name: limits[name] for name in LIMITS if name in limits}
        features = ["timestamp-query"] if timing.wanted(self.config.gpu_timing, self.adapter) else []
        self.spin_s = self._spin_budget()
        self.lone_spin_s = self._lone_spin_budget()
        self.device = self.adapter.request_device_sync(required_limits=wanted, required_features=features, label="kem")
        self.timer = timing.Sampler(self.device if features else None, self.config.gpu_timing)
        max_buffer = int(limits["max-buffer-size"])
        self.binding_limit = min(int(limits["max-storage-buffer-binding-size"]), max_buffer)
        self.uniform_limit = int(limits["max-uniform-buffer-binding-size"])
        self.dispatch_limits = DispatchLimits(int(limits["max-compute-workgroups-per-dimension"]))
        self.pool = BufferPool(self.device, self.config.pool_bytes, max_buffer)
        self.storage_align = max(STAGING_ALIGN, int(limits["min-storage-buffer-offset-alignment"]))
        self.uniform_align = max(STAGING_ALIGN, int(limits["min-uniform-buffer-offset-alignment"]))
        self.info = self._describe_adapter()
        self.info["hot_path"] = hot_path.planned(self.config.hot_path)
        self.stats.add_time("device_open", time.perf_counter() - started)
        log.info("using %s (%s)", self.info["name"], self.info["backend"])

    def _spin_budget(self) -> float:
        """Seconds to spin before a blocking wait (gpu/wait.py): none on
        CPU adapters by default, whose driver threads share our cores."""
        assert self.adapter is not None
        if self.config.poll_spin_us is not None:
            return self.config.poll_spin_us / 1e6
        return 0.0 if self.adapter.info.get("adapter_type") == "CPU" else DEFAULT_SPIN_S

    def _lone_spin_budget(self) -> float:
        """Seconds a lone call spins: KEM_POLL_SPIN_US where set, else the
        batches' budget on GPUs and LONE_SPIN_CPU_S on CPU adapters (a lone
        call's spin competes with no other work of this port)."""
        assert self.adapter is not None
        if self.config.poll_spin_us is not None:
            return self.config.poll_spin_us / 1e6
        return LONE_SPIN_CPU_S if self.adapter.info.get("adapter_type") == "CPU" else DEFAULT_SPIN_S

    def rebuild(self) -> None:
        """After device loss: a new adapter, device and pool."""
        self.stats.inc("device_rebuilds")
        old = self.device
        self.close()
        try:
            if old is not None:
                old.destroy()
        except Exception:  # the old device may already be gone
            pass
        self.open()

    def close(self) -> None:
        """Forget the device (calls then open a new one)."""
        self.device = None
        self.pool = None
        self._hot = None
        self.timer = timing.Sampler(None, self.config.gpu_timing)

    @property
    def hot(self) -> hot_path.HotPath:
        """The batch's native calls (gpu/hot_path.py). Built at the first
        batch, not at open: the C-API path's descriptors cost ~200 ms of
        cffi type parsing, which a port's start (and restart after a crash)
        need not wait for."""
        if self._hot is None:
            self._hot = hot_path.choose(self.require(), self.config.hot_path)
        return self._hot

    def require(self) -> wgpu.GPUDevice:
        if self.device is None:
            raise KemError("no_adapter", "the GPU device is not available")
        return self.device

    def _describe_adapter(self) -> dict:
        assert self.adapter is not None
        info = self.adapter.info
        limits = self.adapter.limits
        # The original's six fields with its types (wgpu's Rust AdapterInfo):
        # vendor and device are the PCI ids as integers, backend lower-case.
        return {
            "name": info.get("device", ""),
            "vendor": int(info.get("vendor_id", 0) or 0),
            "device": int(info.get("device_id", 0) or 0),
            "driver": info.get("description", ""),
            "backend": str(info.get("backend_type", "")).lower(),
            "vendor_name": info.get("vendor", ""),
            "driver_info": info.get("description", ""),
            "adapter_type": info.get("adapter_type", ""),
            "vendor_id": info.get("vendor_id", 0),
            "device_id": info.get("device_id", 0),
            "limits": {
                "max_storage_buffer_binding_size": int(limits["max-storage-buffer-binding-size"]),
                "max_buffer_size": int(limits["max-buffer-size"]),
                "max_compute_workgroups_per_dimension": int(limits["max-compute-workgroups-per-dimension"]),
                "max_compute_workgroup_storage_size": int(limits["max-compute-workgroup-storage-size"]),
                "max_uniform_buffer_binding_size": int(limits["max-uniform-buffer-binding-size"]),
                "max_output_bytes": self.config.max_output_bytes,
                "max_input_bytes": self.config.max_input_bytes,
            },
        }

    def adapter_info_json(self, extra: dict | None = None) -> bytes:
        data = dict(self.info)
        if extra:
            data.update(extra)
        return json.dumps(data, sort_keys=True).encode()

    def destroy_for_test(self) -> None:
        """Test hook: lose the device as a driver reset would."""
        if self.device is not None:
            self.device.destroy()
