"""The native calls of a batch, behind one interface, two ways.

A batch needs the same dozen operations every time: write, encode
(clear, pass, pipeline, bind group, dispatch, copy, resolve, finish),
submit, map, wait, read, unmap. :class:`WrapperPath` does them with
wgpu-py's public objects; ``gpu/native.NativePath`` does them on
wgpu-native's C API with descriptors built once (2-3x less host time a
small call: scripts/bench_native.py). :func:`choose` takes the C API when
the installed wgpu-py has every member it needs and ``KEM_HOT_PATH`` does
not ask for the wrappers; the wrappers are the fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import wgpu

from kem_port.gpu import wgpu_private
from kem_port.gpu.native import NativePath
from kem_port.gpu.wait import wait_for_map

log = logging.getLogger("kem_port.gpu")


class WrapperEncoder:
    """NativeEncoder's methods on wgpu-py's public encoder objects."""

    __slots__ = ("_encoder", "_pass")

    def __init__(self, device: wgpu.GPUDevice) -> None:
        self._encoder = device.create_command_encoder()
        self._pass = None

    def clear_buffer(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> None:
        self._encoder.clear_buffer(buffer, offset, size)

    def begin_pass(self, timestamps: wgpu.GPUQuerySet | None = None) -> None:
        if timestamps is None:
            self._pass = self._encoder.begin_compute_pass()
        else:
            writes = {"query_set": timestamps, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
            self._pass = self._encoder.begin_compute_pass(timestamp_writes=writes)

    def set_pipeline(self, pipeline: wgpu.GPUComputePipeline) -> None:
        self._pass.set_pipeline(pipeline)

    def set_bind_group(self, group: wgpu.GPUBindGroup, index: int = 0) -> None:
        self._pass.set_bind_group(index, group)

    def dispatch(self, x: int, y: int = 1, z: int = 1) -> None:
        self._pass.dispatch_workgroups(x, y, z)

    def dispatch_each(self, groups: list, x: int, y: int, z: int) -> None:
        for group in groups:
            self._pass.set_bind_group(0, group)
            self._pass.dispatch_workgroups(x, y, z)

    def end_pass(self) -> None:
        self._pass.end()
        self._pass = None

    def copy(self, source: wgpu.GPUBuffer, source_offset: int, dest: wgpu.GPUBuffer, dest_offset: int, size: int) -> None:
        self._encoder.copy_buffer_to_buffer(source, source_offset, dest, dest_offset, size)

    def resolve_queries(self, query_set: wgpu.GPUQuerySet, count: int, dest: wgpu.GPUBuffer, offset: int) -> None:
        self._encoder.resolve_query_set(query_set, 0, count, dest, offset)

    def finish(self) -> wgpu.GPUCommandBuffer:
        if self._pass is not None:
            self.end_pass()
        return self._encoder.finish()

    def abandon(self) -> None:
        self._pass = None
        self._encoder = None


class WrapperPath:
    """NativePath's methods on wgpu-py's public objects (the fallback)."""

    def __init__(self, device: wgpu.GPUDevice) -> None:
        self.device = device
        self.queue = device.queue

    def write(self, buffer: wgpu.GPUBuffer, offset: int, data, size: int | None = None) -> None:
        if size is None:
            self.queue.write_buffer(buffer, offset, data)
        elif size:
            self.queue.write_buffer(buffer, offset, data, 0, size)

    def encoder(self) -> WrapperEncoder:
        return WrapperEncoder(self.device)

    def submit(self, commands: wgpu.GPUCommandBuffer) -> None:
        self.queue.submit([commands])
        return None

    def discard(self, commands: wgpu.GPUCommandBuffer) -> None:
        """A command buffer that will not be submitted (wgpu-py frees it)."""

    def map_read(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> Any:
        assert offset == 0
        return wgpu_private.map_for_reading_unsynced(buffer, size)

    def wait(self, mapping: Any, spin_s: float, index: int | None = None) -> bool:
        return wait_for_map(self.device, mapping, spin_s)

    def mapped(self, buffer: wgpu.GPUBuffer, offset: int, size: int) -> memoryview:
        return buffer.read_mapped(offset, size, copy=False)

    def unmap(self, buffer: wgpu.GPUBuffer) -> None:
        buffer.unmap()


HotPath = WrapperPath | NativePath


def name(path: HotPath | None) -> str:
    """How adapter_info names the path in use."""
    return "native" if isinstance(path, NativePath) else "wrappers"
CHOICES = ("auto", "native", "wrappers")


def planned(wanted: str = "auto") -> str:
    """Which path `choose` will take ("native" or "wrappers"), from a quick
    check of the members (no device, no C type parsing).

    ``wanted`` (KEM_HOT_PATH): ``auto``, ``native`` (the C API or an error
    naming what is missing), ``wrappers``."""
    wanted = wanted.lower()
    if wanted not in CHOICES:
        raise ValueError(f"KEM_HOT_PATH={wanted!r}: use one of {', '.join(CHOICES)}")
    if wanted == "wrappers":
        return "wrappers"
    gone = wgpu_private.missing_native_members(types=False)
    if gone and wanted == "native":
        raise RuntimeError(f"KEM_HOT_PATH=native, but this wgpu-py lacks {', '.join(gone)}")
    if gone:
        log.warning("wgpu-py lacks %s: using its public objects (slower)", ", ".join(gone))
    return "wrappers" if gone else "native"


def choose(device: wgpu.GPUDevice, wanted: str = "auto") -> HotPath:
    """The C-API path where it can run, else the wrappers (see `planned`)."""
    if planned(wanted) == "wrappers":
        return WrapperPath(device)
    try:
        return NativePath(device)
    except Exception as exc:  # a C type this wgpu-py no longer declares
        if wanted.lower() == "native":
            raise
        log.warning("the C-API path failed to start (%s): using wgpu-py's objects", exc)
        return WrapperPath(device)


def read_each(path: NativePath, stagings: list[tuple[wgpu.GPUBuffer, int, Callable[[], Any]]], spin_s: float,
              index: int | None) -> list[Any]:
    """After one submission (``index``) of several kits (a named batch, a
    chain batch): map each kit's staging buffer, wait once for the
    submission (the other maps need only a poll), then ``read`` each (its
    copy out and its unmap). Every buffer is read, so every one is unmapped,
    even after a failure; the first wgpu.GPUError is then raised."""
    mappings = [path.map_read(buffer, 0, size) for buffer, size, _ in stagings]
    for mapping in mappings:
        path.wait(mapping, spin_s, index)
        index = None
    results, failed = [], None
    for _, _, read in stagings:
        try:
            results.append(read())
        except wgpu.GPUError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return results


def write_whole(path: HotPath, buffer: wgpu.GPUBuffer, data: bytes | memoryview, size: int) -> None:
    """A buffer of ``size`` bytes written whole: ``data``, then zeros (a kit's
    or pooled buffer holds an earlier caller's bytes). Queue writes come in
    whole words, so a ragged tail is joined to its zeros; the tail is short
    (sizes pad lengths to 4, uniforms to 16)."""
    whole = len(data) & ~3
    if whole:
        path.write(buffer, 0, data, whole)
    if whole < size:
        path.write(buffer, whole, bytes(data[whole:]) + bytes(size - len(data)))
