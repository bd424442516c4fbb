"""The original kem's per-call design, for the benchmark's baseline.

Every call does what the Rust NIF did: a new wgpu adapter and device, a
shader compile and pipeline, fresh buffers, one dispatch, a read back.
``python tools/seed_design.py N`` runs N such calls of the double kernel
on 4 bytes and prints JSON {calls, seconds, calls_per_s, median_ms}.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from kem_port.kernel_store import PACKAGED_KERNELS


def one_call(source: str, data: bytes) -> bytes:
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync()
    module = device.create_shader_module(code=source)
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    src = device.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.STORAGE)
    dst = device.create_buffer(size=len(data), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0),
        entries=[{"binding": 0, "resource": {"buffer": src}}, {"binding": 1, "resource": {"buffer": dst}}],
    )
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(1)
    compute.end()
    device.queue.submit([encoder.finish()])
    return bytes(device.queue.read_buffer(dst))


def main(argv: list[str]) -> int:
    calls = int(argv[1]) if len(argv) > 1 else 10
    source = (PACKAGED_KERNELS / "double.wgsl").read_text()
    assert one_call(source, bytes([1, 3, 5, 7])) == bytes([2, 6, 10, 14])
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        one_call(source, bytes([1, 3, 5, 7]))
        times.append(time.perf_counter() - started)
    total = sum(times)
    print(json.dumps({"calls": calls, "seconds": total, "calls_per_s": calls / total,
                      "median_ms": statistics.median(times) * 1e3}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
