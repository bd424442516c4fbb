#!/usr/bin/env python3
"""Cost of admitting a new kernel (admission/guard.py) against compiling it
in-process, and of a known kernel's lookup. Each new kernel is distinct
(a different constant), so nothing is cached; the worker is warm (started
and used once before timing). Usage: python scripts/bench_admission.py [N]"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from kem_port.admission.guard import CompileGuard, GuardSettings
from kem_port.admission.probe import open_device
from kem_port.admission.rejects import RejectStore
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.contract import layout_entries
from kem_port.gpu.wgsl.wgsl_reflect import reflect
from kem_port.kernel_store import source_from_bytes

KERNEL = """@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
var<workgroup> tile: array<u32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) i: u32) {
    tile[i] = inp[g.x] * %du;
    workgroupBarrier();
    if (g.x < arrayLength(&out)) { out[g.x] = tile[63u - i]; }
}
"""
CALL = KernelCall("bench", b"", 4)


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:.1f} ms, min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f}"


def main(n: int) -> None:
    guard = CompileGuard(GuardSettings(), RejectStore(Path(tempfile.mkdtemp()) / "rejected"))
    started = time.perf_counter()
    guard.admit(source_from_bytes("warm", (KERNEL % 1).encode(), "bench", "strict"), CALL)
    print(f"worker start + first admission: {(time.perf_counter() - started) * 1e3:.0f} ms")
    admitted, known = [], []
    for k in range(n):
        source = source_from_bytes(f"k{k}", (KERNEL % (k + 2)).encode(), "bench", "strict")
        started = time.perf_counter()
        guard.admit(source, CALL)
        admitted.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert guard.is_admitted(source, CALL) is not None
        known.append(time.perf_counter() - started)
    _, device = open_device(None)
    direct = []
    for k in range(n):
        code = KERNEL % (k + 1000)
        started = time.perf_counter()
        module = device.create_shader_module(code=code)
        layout = device.create_bind_group_layout(entries=layout_entries(reflect(code), False))
        device.create_compute_pipeline(layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
                                       compute={"module": module, "entry_point": "main"})
        direct.append(time.perf_counter() - started)
    print(f"new kernel, admitted (limits + rewrite + worker compile): {ms(admitted)}")
    print(f"the same compile in-process (baseline, what the port then also does): {ms(direct)}")
    print(f"known kernel (is_admitted): median {statistics.median(known) * 1e6:.1f} us")
    guard.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
