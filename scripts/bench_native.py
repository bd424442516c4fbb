#!/usr/bin/env python3
"""Wrapper vs C-API hot path, in one process, on one device: the stages of an
executor batch (upload, encode, submit, wait, read) done through wgpu-py's
public objects and through kem_port/gpu/native.py.

Two shapes: a lone 4-byte call, and a batch of N small calls laid out as
the executor lays them out (one packed upload, one clear, one pass with a
bind group + dispatch per call, one copy, one submit, one map). Each
iteration's results are checked against numpy. Prints one JSON line per
(shape, path) with per-stage medians in microseconds.

Usage: scripts/bench_native.py [--iterations N] [--batch N] [--spin-us N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import wgpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kem_port.gpu import native as native_path, wgpu_private  # noqa: E402
from kem_port.gpu.wait import wait_for_map  # noqa: E402
from kem_port.kernel_store import PACKAGED_KERNELS  # noqa: E402

# The packaged double kernel (what users run), 256-invocation workgroups.
KERNEL = (PACKAGED_KERNELS / "double.wgsl").read_text()
WORKGROUP = 256
ALIGN = 256
STAGES = ("upload", "encode", "submit", "wait", "read", "total")
U = wgpu.BufferUsage


class Rig:
    """Device, pipeline and reused buffers for `calls` calls of `words` words each."""

    def __init__(self, device: wgpu.GPUDevice, calls: int, words: int) -> None:
        self.device = device
        self.calls, self.words = calls, words
        self.stride = -(-words * 4 // ALIGN) * ALIGN
        total = self.stride * calls
        self.input = device.create_buffer(size=total, usage=U.STORAGE | U.COPY_DST)
        self.output = device.create_buffer(size=total, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
        self.staging = device.create_buffer(size=total, usage=U.MAP_READ | U.COPY_DST)
        self.total = total
        self.pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": device.create_shader_module(code=KERNEL), "entry_point": "main"}
        )
        layout = self.pipeline.get_bind_group_layout(0)
        self.groups = [
            device.create_bind_group(layout=layout, entries=[
                {"binding": 0, "resource": {"buffer": self.input, "offset": i * self.stride, "size": words * 4}},
                {"binding": 1, "resource": {"buffer": self.output, "offset": i * self.stride, "size": words * 4}},
            ])
            for i in range(calls)
        ]
        self.workgroups = -(-words // WORKGROUP)

    def fresh_input(self, rng: np.random.Generator) -> tuple[bytearray, np.ndarray]:
        values = rng.integers(0, 2**30, size=(self.calls, self.words), dtype=np.uint32)
        packed = bytearray(self.total)
        for i in range(self.calls):
            packed[i * self.stride : i * self.stride + self.words * 4] = values[i].tobytes()
        return packed, values * 2

    def check(self, view: memoryview, expected: np.ndarray) -> None:
        for i in range(self.calls):
            got = np.frombuffer(view[i * self.stride : i * self.stride + self.words * 4], dtype=np.uint32)
            if not np.array_equal(got, expected[i]):
                raise SystemExit(f"wrong result for call {i}")


def run_wrappers(rig: Rig, packed: bytearray, spin_s: float, expected: np.ndarray) -> list[float]:
    t = time.perf_counter
    queue = rig.device.queue
    t0 = t()
    queue.write_buffer(rig.input, 0, packed)
    t1 = t()
    encoder = rig.device.create_command_encoder()
    encoder.clear_buffer(rig.output, 0, rig.total)
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(rig.pipeline)
    for group in rig.groups:
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(rig.workgroups)
    compute.end()
    encoder.copy_buffer_to_buffer(rig.output, 0, rig.staging, 0, rig.total)
    commands = encoder.finish()
    t2 = t()
    queue.submit([commands])
    promise = rig.staging.map_async("READ_NOSYNC", 0, rig.total)
    t3 = t()
    wait_for_map(rig.device, promise, spin_s)
    t4 = t()
    view = rig.staging.read_mapped(0, rig.total, copy=False)
    rig.check(view, expected)
    rig.staging.unmap()
    t5 = t()
    return [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0]


def run_native(rig: Rig, native: native_path.NativePath, packed: bytearray, spin_s: float, expected: np.ndarray) -> list[float]:
    t = time.perf_counter
    t0 = t()
    native.write(rig.input, 0, packed)
    t1 = t()
    encoder = native.encoder()
    encoder.clear_buffer(rig.output, 0, rig.total)
    encoder.begin_pass()
    encoder.set_pipeline(rig.pipeline)
    for group in rig.groups:
        encoder.set_bind_group(group)
        encoder.dispatch(rig.workgroups)
    encoder.end_pass()
    encoder.copy(rig.output, 0, rig.staging, 0, rig.total)
    commands = encoder.finish()
    t2 = t()
    index = native.submit(commands)
    mapping = native.map_read(rig.staging, 0, rig.total)
    t3 = t()
    native.wait(mapping, spin_s, index)
    t4 = t()
    view = native.mapped(rig.staging, 0, rig.total)
    rig.check(view, expected)
    native.unmap(rig.staging)
    t5 = t()
    return [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0]


def summarize(shape: str, path: str, rows: list[list[float]], calls: int, adapter: str) -> dict:
    result: dict = {"shape": shape, "path": path, "adapter": adapter, "iterations": len(rows)}
    for k, stage in enumerate(STAGES):
        values = sorted(row[k] * 1e6 for row in rows)
        result[f"{stage}_p50_us"] = round(statistics.median(values), 1)
    totals = sorted(row[-1] for row in rows)
    result["total_p99_us"] = round(totals[int(len(totals) * 0.99)] * 1e6, 1)
    result["calls_per_s"] = round(calls / statistics.median(totals))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--spin-us", type=float, default=None, help="default: 0 on CPU adapters, 2000 on GPUs")
    args = parser.parse_args()
    if wgpu_private.missing_native_members():
        raise SystemExit(f"C-API path unavailable: {wgpu_private.missing_native_members()}")
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync()
    name = adapter.info.get("device", "?")
    spin_s = (args.spin_us if args.spin_us is not None else (0 if adapter.info.get("adapter_type") == "CPU" else 2000)) / 1e6
    native = native_path.NativePath(device)
    rng = np.random.default_rng(7)
    warmup = max(args.iterations // 10, 10)
    for shape, calls in (("lone 4 B", 1), (f"batch of {args.batch} x 4 B", args.batch)):
        rig = Rig(device, calls, 1)
        inputs = [rig.fresh_input(rng) for _ in range(16)]
        rows: dict[str, list] = {"wrappers": [], "C API": []}
        # Interleaved, so drift in the machine's load hits both paths alike.
        for n in range(warmup + args.iterations):
            packed, expected = inputs[n % len(inputs)]
            for path in rows:
                if path == "wrappers":
                    row = run_wrappers(rig, packed, spin_s, expected)
                else:
                    row = run_native(rig, native, packed, spin_s, expected)
                if n >= warmup:
                    rows[path].append(row)
        for path, data in rows.items():
            print(json.dumps(summarize(shape, path, data, calls, name)), flush=True)


if __name__ == "__main__":
    main()
