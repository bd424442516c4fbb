"""What gas costs (issue 27): a long per-element loop and a tiled matmul,
each compiled as written and as its gas form (gpu/wgsl/wgsl_gas.py), run
interleaved on one device in one process; prints the median GPU round
trip of each and the overhead.

    .venv/bin/python scripts/gas_overhead.py [--runs 15] [--n 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import wgpu

from kem_port.gpu import gas_meter
from kem_port.gpu.wgsl.wgsl_canonical import canonical
from kem_port.gpu.wgsl.wgsl_gas import gas_form

LONG_LOOP = """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = inp[g.x];
  for (var k = 0u; k < ITERS; k++) { x = x * 1664525u + 1013904223u; }
  out[g.x] = x;
}
"""
MATMUL = """
@group(0) @binding(0) var<storage, read> inp: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<workgroup> ta: array<f32, 256>;
var<workgroup> tb: array<f32, 256>;
@compute @workgroup_size(16, 16) fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
  let n = NN;
  var acc = 0.0;
  for (var t = 0u; t < n / 16u; t++) {
    ta[l.y * 16u + l.x] = inp[g.y * n + t * 16u + l.x];
    tb[l.y * 16u + l.x] = inp[n * n + (t * 16u + l.y) * n + g.x];
    workgroupBarrier();
    for (var k = 0u; k < 16u; k++) { acc += ta[l.y * 16u + k] * tb[k * 16u + l.x]; }
    workgroupBarrier();
  }
  out[g.y * n + g.x] = acc;
}
"""


def prepared(dev, text: str, metered: bool, data: np.ndarray, out_bytes: int):
    code = gas_form(canonical(text)).text if metered else text
    layouts = [dev.create_bind_group_layout(entries=[
        {"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "read-only-storage"}},
        {"binding": 1, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "storage"}}])]
    if metered:
        layouts.append(dev.create_bind_group_layout(entries=gas_meter.layout_entries()))
    pipeline = dev.create_compute_pipeline(layout=dev.create_pipeline_layout(bind_group_layouts=layouts),
                                           compute={"module": dev.create_shader_module(code=code), "entry_point": "main"})
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    inp = dev.create_buffer_with_data(data=data, usage=usage)
    out = dev.create_buffer(size=out_bytes, usage=usage)
    groups = [dev.create_bind_group(layout=layouts[0], entries=[
        {"binding": 0, "resource": {"buffer": inp}}, {"binding": 1, "resource": {"buffer": out}}])]
    if metered:
        cap = dev.create_buffer_with_data(data=np.array([1 << 30, 0, 0, 0], np.uint32), usage=wgpu.BufferUsage.UNIFORM)
        meter = dev.create_buffer(size=16, usage=usage)
        groups.append(dev.create_bind_group(layout=layouts[1], entries=[
            {"binding": 0, "resource": {"buffer": cap}}, {"binding": 1, "resource": {"buffer": meter}}]))
    return pipeline, groups, out


def once(dev, pipeline, groups, out, workgroups) -> float:
    started = time.perf_counter()
    encoder = dev.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    for index, group in enumerate(groups):
        compute.set_bind_group(index, group)
    compute.dispatch_workgroups(*workgroups)
    compute.end()
    dev.queue.submit([encoder.finish()])
    dev.queue.read_buffer(out, 0, 4)  # waits for the dispatch
    return time.perf_counter() - started


def compare(dev, name: str, text: str, data: np.ndarray, out_bytes: int, workgroups, runs: int) -> None:
    plain = prepared(dev, text, False, data, out_bytes)
    metered = prepared(dev, text, True, data, out_bytes)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):  # warm: lavapipe compiles at the first dispatch
        once(dev, *plain, workgroups), once(dev, *metered, workgroups)
    for _ in range(runs):
        times[False].append(once(dev, *plain, workgroups))
        times[True].append(once(dev, *metered, workgroups))
    base, gas = statistics.median(times[False]), statistics.median(times[True])
    same = bytes(dev.queue.read_buffer(plain[2])) == bytes(dev.queue.read_buffer(metered[2]))
    print(f"{name}: as written {base * 1e3:.2f} ms, gas form {gas * 1e3:.2f} ms, "
          f"overhead {100 * (gas / base - 1):+.1f}% (median of {runs}, interleaved; outputs identical: {same})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--n", type=int, default=256, help="matmul side (a multiple of 16)")
    parser.add_argument("--iters", type=int, default=4096, help="loop iterations per element")
    parser.add_argument("--elements", type=int, default=16384)
    args = parser.parse_args()
    dev = wgpu.utils.get_default_device()
    print(f"adapter: {dev.adapter.info.get('device', '?')} ({dev.adapter.info.get('adapter_type', '?')})")
    rng = np.random.default_rng()
    data = rng.integers(0, 2**32, args.elements, dtype=np.uint32)
    compare(dev, f"per-element loop ({args.elements} x {args.iters})", LONG_LOOP.replace("ITERS", f"{args.iters}u"),
            data, data.nbytes, (args.elements // 64, 1, 1), args.runs)
    n = args.n
    mats = rng.random(2 * n * n, dtype=np.float32)
    compare(dev, f"tiled matmul {n}x{n}", MATMUL.replace("NN", f"{n}u"), mats, 4 * n * n, (n // 16, n // 16, 1), args.runs)


if __name__ == "__main__":
    main()
