"""Does this adapter leak workgroup memory between dispatches?

One kernel writes a pattern to a ``var<workgroup>`` array; a second, run
after it, reads the same array without writing it. WGSL says the second
must read zeros; lavapipe returns the first kernel's pattern (issue 13).
The compile worker runs this on its own device at start (the same driver
as the port's) and the guard rewrites kernels (admission/zeroing.py) where
it leaks.
"""

from __future__ import annotations

import numpy as np
import wgpu

from kem_port.gpu.device import LIMITS, choose_adapter

WORDS = 64
PROBE_GROUPS = 256
PATTERN = 0x6B656D00  # "kem\0"
_DECLS = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
var<workgroup> shared_words: array<u32, 64>;
"""
WRITER = _DECLS + """
@compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) {
    shared_words[i] = 0x6B656D00u + i;
    workgroupBarrier();
    out[i] = shared_words[63u - i];  // every group writes the same words
}
"""
READER = _DECLS + """
@compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) {
    out[i] = shared_words[i];
}
"""


def open_device(selector: str | None) -> tuple[wgpu.GPUAdapter, wgpu.GPUDevice]:
    """The adapter the port picks, with the limits the port asks for (so
    a kernel validates here exactly as it will there)."""
    adapter = choose_adapter(selector)
    limits = adapter.limits
    wanted = {name: limits[name] for name in LIMITS if name in limits}
    return adapter, adapter.request_device_sync(required_limits=wanted, label="kem-compile-worker")


def run_once(device: wgpu.GPUDevice, code: str) -> np.ndarray:
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=code), "entry_point": "main"})
    out = device.create_buffer(size=WORDS * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": out}}])
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    # Many groups, so each of the driver's worker threads runs some: a
    # leak through one thread's memory shows whichever thread reads.
    compute.dispatch_workgroups(PROBE_GROUPS)
    compute.end()
    device.queue.submit([encoder.finish()])
    return np.frombuffer(device.queue.read_buffer(out), np.uint32)


def workgroup_memory_leaks(device: wgpu.GPUDevice, code_filter=lambda code: code) -> bool:
    """True when a dispatch reads what an earlier one left in workgroup
    memory. code_filter lets a test run the reader through the rewrite.
    A miss proves nothing (the leak depends on which driver thread runs
    which group), hence KEM_ZERO_WORKGROUP=on by default."""
    for _ in range(5):
        run_once(device, WRITER)
        if run_once(device, code_filter(READER)).any():
            return True
    return False
