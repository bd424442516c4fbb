"""Compiled pipelines for kernels run in a session or chain.

They differ from a plain call's (gpu/pipelines.py) only in their layout:
bindings from 3 up are named storage buffers (gpu/session_contract.py).
Cached per (kernel sha256, entry point, with or without params) for one
device; a new device empties the cache.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import wgpu

from kem_port.gpu import contract
from kem_port.gpu.session import session_contract
from kem_port.gpu.pipelines import compile_with_layout
from kem_port.gpu.session.session_contract import SessionLayout
from kem_port.gpu.wgpu_private import serial_of
from kem_port.gpu.wgsl.wgsl_reflect import KernelShape, reflect
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

CACHE_SIZE = 128
BIND_GROUP_CACHE_SIZE = 512


@dataclass(frozen=True)
class SessionPipeline:
    pipeline: wgpu.GPUComputePipeline
    layout: wgpu.GPUBindGroupLayout
    shape: SessionLayout
    serial: int  # never reused: keys the bind group cache


class SessionPipelines:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._device: wgpu.GPUDevice | None = None
        self._cache: OrderedDict[tuple, SessionPipeline] = OrderedDict()
        self._shapes: dict[str, KernelShape] = {}
        self._bind_groups: OrderedDict[tuple, wgpu.GPUBindGroup] = OrderedDict()
        self._serial = 0

    def has(self, source: KernelSource, entry_point: str, params: bytes | None) -> bool:
        return (source.sha256, entry_point, params is not None) in self._cache

    def get(self, device: wgpu.GPUDevice, source: KernelSource, entry_point: str, params: bytes | None) -> SessionPipeline:
        if device is not self._device:
            self._cache.clear()
            self._bind_groups.clear()
            self._device = device
        key = (source.sha256, entry_point, params is not None)
        found = self._cache.get(key)
        if found is not None:
            if params is not None:
                contract.check_params_size(self._shapes[source.sha256], params)
            self._cache.move_to_end(key)
            return found
        shape = self._shapes.get(source.sha256)
        if shape is None:
            shape = self._shapes[source.sha256] = reflect(source.text)
        layout = session_contract.check_session_layout(shape, entry_point, params)
        started = time.perf_counter()
        self._serial += 1
        compiled = _compile(device, source, entry_point, layout, params is not None, self._serial)
        self.stats.inc("compiles")
        self.stats.add_time("compile", time.perf_counter() - started)
        self._cache[key] = compiled
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def bind_group(self, device: wgpu.GPUDevice, pipeline: SessionPipeline, entries: list[dict]) -> wgpu.GPUBindGroup:
        """A bind group, cached by pipeline and each entry's buffer serial,
        offset and size: a chain run again on pooled buffers creates none
        (a bind group is one more native call per step, ~20 us here)."""
        key = (pipeline.serial,) + tuple(
            (e["binding"], serial_of(e["resource"]["buffer"]), e["resource"]["offset"], e["resource"]["size"]) for e in entries
        )
        group = self._bind_groups.get(key)
        if group is not None:
            self._bind_groups.move_to_end(key)
            return group
        group = self._bind_groups[key] = device.create_bind_group(layout=pipeline.layout, entries=entries)
        while len(self._bind_groups) > BIND_GROUP_CACHE_SIZE:
            self._bind_groups.popitem(last=False)
        return group


def _compile(device: wgpu.GPUDevice, source: KernelSource, entry: str, layout: SessionLayout, has_params: bool, serial: int) -> SessionPipeline:
    entries = session_contract.layout_entries(layout, has_params)
    pipeline, group_layout = compile_with_layout(device, source, entry, entries)
    return SessionPipeline(pipeline, group_layout, layout, serial)
