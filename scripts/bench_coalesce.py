#!/usr/bin/env python3
"""Many calls, one dispatch: items/s of a batch of small calls to one
kernel, dispatched per call (today's executor layout: a bind group, a
set_bind_group and a dispatch per call) and through the call table
(kem_port/gpu/call_table.py: one dispatch for the batch), both on the C-API
path, in one process, interleaved. Each batch is timed whole: pack the
inputs, upload, encode, submit, wait, and hand each call its own bytes.
Every result is checked against numpy.

Usage: scripts/bench_coalesce.py [--iterations N] [--spin-us N] [--shapes CALLSxWORDS,...]
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
from kem_port.gpu.group import call_table  # noqa: E402
from kem_port.gpu import native as native_path
from kem_port.kernel_store import PACKAGED_KERNELS  # noqa: E402

U = wgpu.BufferUsage
ALIGN = 256
# The packaged kernels (what users run): double, and double written for the
# call table. Both use 256-invocation workgroups.
PLAIN = (PACKAGED_KERNELS / "double.wgsl").read_text()
TABLED = (PACKAGED_KERNELS / "double_table.wgsl").read_text()
WORKGROUP = 256


def pipeline(device, code):
    return device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=code), "entry_point": "main"})


class Batch:
    def __init__(self, device, calls: int, words: int, tight: bool) -> None:
        # Per-call dispatches bind each call at an aligned offset; the table
        # packs calls back to back (its offsets need only word alignment).
        self.calls, self.words = calls, words
        self.stride = words * 4 if tight else -(-words * 4 // ALIGN) * ALIGN
        self.total = max(self.stride * calls, 4)
        self.input = device.create_buffer(size=self.total, usage=U.STORAGE | U.COPY_DST)
        self.output = device.create_buffer(size=self.total, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
        self.staging = device.create_buffer(size=self.total, usage=U.MAP_READ | U.COPY_DST)


def per_call(device, native, batch, pipe, groups, payloads, spin_s):
    packed = bytearray(batch.total)
    for i, data in enumerate(payloads):
        packed[i * batch.stride : i * batch.stride + len(data)] = data
    native.write(batch.input, 0, packed)
    enc = native.encoder()
    enc.clear_buffer(batch.output, 0, batch.total)
    enc.begin_pass()
    enc.set_pipeline(pipe)
    wg = -(-batch.words // WORKGROUP)
    for group in groups:
        enc.set_bind_group(group)
        enc.dispatch(wg)
    enc.end_pass()
    enc.copy(batch.output, 0, batch.staging, 0, batch.total)
    index = native.submit(enc.finish())
    native.wait(native.map_read(batch.staging, 0, batch.total), spin_s, index)
    view = native.mapped(batch.staging, 0, batch.total)
    results = [bytes(view[i * batch.stride : i * batch.stride + batch.words * 4]) for i in range(batch.calls)]
    native.unmap(batch.staging)
    return results, batch.calls


def tabled(device, native, batch, pipe, layout, table_buf, payloads, spin_s, max_groups):
    offset, slots = 0, []
    for p in payloads:
        slots.append(call_table.Slot(offset, len(p), len(p)))
        offset += len(p)
    table = call_table.build(slots)
    native.write(batch.input, 0, b"".join(payloads))
    native.write(table_buf, 0, table.rows)
    enc = native.encoder()
    enc.clear_buffer(batch.output, 0, batch.total)
    enc.begin_pass()
    enc.set_pipeline(pipe)
    # One bind group for the batch; kem caches them by buffer and sizes,
    # so steady traffic makes none.
    key = (table.output_bytes, len(table.rows))
    group = layout.cache.get(key)
    if group is None:
        group = layout.cache[key] = device.create_bind_group(layout=layout.layout, entries=[
            {"binding": 0, "resource": {"buffer": batch.input, "offset": 0, "size": batch.total}},
            {"binding": 1, "resource": {"buffer": batch.output, "offset": 0, "size": table.output_bytes}},
            {"binding": 3, "resource": {"buffer": table_buf, "offset": 0, "size": len(table.rows)}},
        ])
    enc.set_bind_group(group)
    enc.dispatch(*call_table.workgroups(table.items, WORKGROUP, max_groups))
    enc.end_pass()
    enc.copy(batch.output, 0, batch.staging, 0, table.output_bytes)
    index = native.submit(enc.finish())
    native.wait(native.map_read(batch.staging, 0, batch.total), spin_s, index)
    view = native.mapped(batch.staging, 0, batch.total)
    results = [bytes(view[o : o + s.output_bytes]) for o, s in zip(table.output_offsets, slots)]
    native.unmap(batch.staging)
    return results, 1


class Layout:
    def __init__(self, layout):
        self.layout = layout
        self.cache = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--spin-us", type=float, default=None)
    parser.add_argument("--shapes", default="64x1,1024x1,4096x1,16384x1,256x64,64x1024")
    args = parser.parse_args()
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync(required_limits={
        "max-storage-buffer-binding-size": adapter.limits["max-storage-buffer-binding-size"],
        "max-buffer-size": adapter.limits["max-buffer-size"]})
    name = adapter.info.get("device", "?")
    spin_us = args.spin_us if args.spin_us is not None else (0 if adapter.info.get("adapter_type") == "CPU" else 2000)
    max_groups = int(adapter.limits["max-compute-workgroups-per-dimension"])
    native = native_path.NativePath(device)
    plain_pipe, table_pipe = pipeline(device, PLAIN), pipeline(device, TABLED)
    rng = np.random.default_rng(11)
    for shape in args.shapes.split(","):
        calls, words = (int(v) for v in shape.split("x"))
        loose, tight = Batch(device, calls, words, False), Batch(device, calls, words, True)
        playout = plain_pipe.get_bind_group_layout(0)
        groups = [device.create_bind_group(layout=playout, entries=[
            {"binding": 0, "resource": {"buffer": loose.input, "offset": i * loose.stride, "size": words * 4}},
            {"binding": 1, "resource": {"buffer": loose.output, "offset": i * loose.stride, "size": words * 4}},
        ]) for i in range(calls)]
        table_buf = device.create_buffer(size=calls * call_table.ROW_BYTES, usage=U.STORAGE | U.COPY_DST)
        tlayout = Layout(table_pipe.get_bind_group_layout(0))
        inputs = []
        for _ in range(4):
            values = rng.integers(0, 2**30, size=(calls, words), dtype=np.uint32)
            inputs.append(([v.tobytes() for v in values], [(v * 2).tobytes() for v in values]))
        times = {"per-call dispatch": [], "call table": []}
        dispatch_count = {}
        for n in range(args.iterations + 5):
            payloads, expected = inputs[n % len(inputs)]
            for path in times:
                t0 = time.perf_counter()
                if path == "per-call dispatch":
                    results, dispatches = per_call(device, native, loose, plain_pipe, groups, payloads, spin_us / 1e6)
                else:
                    results, dispatches = tabled(device, native, tight, table_pipe, tlayout, table_buf, payloads, spin_us / 1e6, max_groups)
                elapsed = time.perf_counter() - t0
                if results != expected:
                    raise SystemExit(f"{path}: wrong results for {shape}")
                dispatch_count[path] = dispatches
                if n >= 5:
                    times[path].append(elapsed)
        for path, samples in times.items():
            median = statistics.median(samples)
            print(json.dumps({
                "adapter": name, "calls": calls, "words_per_call": words, "path": path,
                "dispatches": dispatch_count[path], "calls_per_dispatch": round(calls / dispatch_count[path], 1),
                "batch_p50_us": round(median * 1e6, 1), "calls_per_s": round(calls / median),
                "items_per_s": round(calls * words / median),
            }), flush=True)


if __name__ == "__main__":
    main()
