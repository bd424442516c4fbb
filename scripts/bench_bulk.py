#!/usr/bin/env python3
"""A bulk call's host copies, today's way and the mapped-upload way, in one
process: shared-memory input file -> GPU (double each u32) -> output file,
as the port does for inputs past shm_threshold. Prints GB/s of payload per
round trip and each stage's median.

today:  read the file into a fresh bytearray (copy 1, page faults), then
        queue.write_buffer (copy 2, into a staging buffer wgpu-native makes
        for each write), GPU copy to the input buffer, dispatch, GPU copy to
        staging, map, write the mapped bytes to the output file (copy 3).
mapped: os.readv from the file straight into a write-mapped upload buffer
        reused across calls (copy 1; a file that shrinks gives a short read,
        never SIGBUS), GPU copy to the input buffer, dispatch, GPU copy to
        staging, map, write to the output file (copy 2).
parts:  the node's way from shm_slot_threshold up (kem_shm_slots): the
        input in 8 part files kept from the last call, read a part per
        thread straight into the upload buffer (copy 1), GPU as above, the
        mapped result written a part per thread into 8 kept files (copy 2):
        the same two copies, in parallel and into existing tmpfs pages.

Usage: scripts/bench_bulk.py [--sizes-mb 16,64] [--iterations N] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import wgpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kem_port.transfer import bulk_io  # noqa: E402
from kem_port.transfer.fd_io import read_into, write_all  # noqa: E402
from kem_port.gpu import native as native_path  # noqa: E402
from kem_port.kernel_store import PACKAGED_KERNELS  # noqa: E402

U = wgpu.BufferUsage
# The packaged double kernel (what users run).
KERNEL = (PACKAGED_KERNELS / "double.wgsl").read_text()
PARTS = 8  # as kem_shm_slots splits a payload
COPIES = {"today": 3, "mapped upload": 2, "parts": 2}


class Rig:
    def __init__(self, device, size: int, max_groups: int) -> None:
        self.size = size
        self.input = device.create_buffer(size=size, usage=U.STORAGE | U.COPY_DST)
        self.output = device.create_buffer(size=size, usage=U.STORAGE | U.COPY_SRC)
        self.staging = device.create_buffer(size=size, usage=U.MAP_READ | U.COPY_DST)
        self.upload = device.create_buffer(size=size, usage=U.MAP_WRITE | U.COPY_SRC)
        self.pipe = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=KERNEL), "entry_point": "main"})
        self.group = device.create_bind_group(layout=self.pipe.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": self.input}}, {"binding": 1, "resource": {"buffer": self.output}}])
        groups = -(-size // 4 // 256)
        self.groups = (groups, 1, 1) if groups <= max_groups else (max_groups, -(-groups // max_groups), 1)


def round_trip(native, rig: Rig, in_path: str, out_path: str, path: str) -> list[float]:
    t = time.perf_counter
    t0 = t()
    mapped = path != "today"
    if path == "parts":
        parts = tuple((f"{in_path}.{k}", os.stat(f"{in_path}.{k}").st_size) for k in range(PARTS))
        size = sum(n for _, n in parts)
        native.wait_idle_map(native.map_write(rig.upload, 0, rig.size))
        bulk_io.read_parts(parts, native.writable(rig.upload, 0, size))
        native.unmap(rig.upload)
    else:
        fd = os.open(in_path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if mapped:
                native.wait_idle_map(native.map_write(rig.upload, 0, rig.size))
                if read_into(fd, native.writable(rig.upload, 0, size)) < size:
                    raise SystemExit("input shrank")
                native.unmap(rig.upload)
            else:
                data = memoryview(bytearray(size))
                if read_into(fd, data) < size:
                    raise SystemExit("input shrank")
        finally:
            os.close(fd)
    t1 = t()
    if not mapped:
        native.write(rig.input, 0, data)
    enc = native.encoder()
    if mapped:
        enc.copy(rig.upload, 0, rig.input, 0, rig.size)
    enc.begin_pass()
    enc.set_pipeline(rig.pipe)
    enc.set_bind_group(rig.group)
    enc.dispatch(*rig.groups)
    enc.end_pass()
    enc.copy(rig.output, 0, rig.staging, 0, rig.size)
    commands = enc.finish()
    t2 = t()
    index = native.submit(commands)
    native.wait(native.map_read(rig.staging, 0, rig.size), 0.0, index)
    t3 = t()
    if path == "parts":
        bulk_io.write_parts([f"{out_path}.{k}" for k in range(PARTS)], native.mapped(rig.staging, 0, rig.size))
    else:
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            write_all(fd, [native.mapped(rig.staging, 0, rig.size)])
        finally:
            os.close(fd)
    native.unmap(rig.staging)
    t4 = t()
    return [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0]


def result_of(out_path: str, path: str) -> bytes:
    if path == "parts":
        return b"".join(Path(f"{out_path}.{k}").read_bytes() for k in range(PARTS))
    return Path(out_path).read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="16,64")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    limits = adapter.limits
    device = adapter.request_device_sync(required_limits={
        "max-storage-buffer-binding-size": limits["max-storage-buffer-binding-size"], "max-buffer-size": limits["max-buffer-size"]})
    native = native_path.NativePath(device)
    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="kem-bench-") as tmp:
        in_path, out_path = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        for mb in (int(v) for v in args.sizes_mb.split(",")):
            size = mb << 20
            values = rng.integers(0, 2**31, size=size // 4, dtype=np.uint32)
            Path(in_path).write_bytes(values.tobytes())
            for k, (a, b) in enumerate(bulk_io.split(size, PARTS)):
                Path(f"{in_path}.{k}").write_bytes(values.tobytes()[a:b])
            expected = (values * 2).tobytes()
            rig = Rig(device, size, int(limits["max-compute-workgroups-per-dimension"]))
            rows: dict[str, list] = {path: [] for path in COPIES}
            for n in range(args.iterations + 1):
                for path in rows:
                    row = round_trip(native, rig, in_path, out_path, path)
                    if n == 0 and result_of(out_path, path) != expected:
                        raise SystemExit(f"{path}: wrong result at {mb} MB")
                    if n:
                        rows[path].append(row)
            for path, data in rows.items():
                med = [statistics.median(col) for col in zip(*data)]
                print(json.dumps({
                    "adapter": adapter.info.get("device"), "size_mb": mb, "path": path,
                    "host_copies": COPIES[path],
                    "read_in_ms": round(med[0] * 1e3, 2), "upload_encode_ms": round(med[1] * 1e3, 2),
                    "gpu_ms": round(med[2] * 1e3, 2), "write_out_ms": round(med[3] * 1e3, 2),
                    "total_ms": round(med[4] * 1e3, 2), "gb_per_s": round(size / med[4] / 1e9, 2),
                }), flush=True)


if __name__ == "__main__":
    main()
