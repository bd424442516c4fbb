"""Run a just-compiled kernel once, in the compile worker, on adapters
that compile at a shader's first dispatch.

Why: llvmpipe (lavapipe, kem's CPU adapter) JITs a compute shader when it
is first dispatched, not in ``create_compute_pipeline``, so the worker's
compile check passed kernels whose real compile is long: a loop-free
300-byte kernel with one dynamically indexed ``array<u32, 4096>`` local
took ~1 s in the worker, then more than 150 s in its first dispatch on
the port's GPU thread, every other caller queued behind it (1,024
elements: ~25 s; red team, issue 24). One workgroup dispatched here puts
that compile inside the sacrificial process, under its deadline and
resource limits: only kernels whose JIT finished in time reach the port.

Only on CPU adapters: GPU drivers compile in create_compute_pipeline, and
a dispatch there would run the kernel on the device for nothing. Every
binding gets PROBE_BYTES of zeros (the default uniform binding limit); a
binding whose declared type needs more makes the probe fail, and the
kernel is admitted as before (the gap is logged, not refused).
Cost on lavapipe: one JIT more per new kernel (~50-200 ms for kem's own).
"""

from __future__ import annotations

from typing import Any

PROBE_BYTES = 64 * 1024


def compiles_at_dispatch(adapter_info: Any) -> bool:
    return str(adapter_info.get("adapter_type", "")).lower() == "cpu"


def dispatch_once(device: Any, pipeline: Any, bindings: dict[int, list[int]]) -> None:
    """One workgroup of pipeline with each (group -> binding numbers) on
    zeros; returns when it has run. GPUError when a binding cannot be made."""
    import wgpu

    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_SRC
    bind_groups, buffers = [], []
    for group in sorted(bindings):
        entries = []
        for binding in bindings[group]:
            buffers.append(device.create_buffer(size=PROBE_BYTES, usage=usage))
            entries.append({"binding": binding, "resource": {"buffer": buffers[-1], "offset": 0, "size": PROBE_BYTES}})
        bind_groups.append((group, device.create_bind_group(layout=pipeline.get_bind_group_layout(group), entries=entries)))
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    for group, bind_group in bind_groups:
        compute.set_bind_group(group, bind_group)
    compute.dispatch_workgroups(1, 1, 1)
    compute.end()
    device.queue.submit([encoder.finish()])
    # Reading a buffer back waits for the work submitted before it: the JIT
    # and the one workgroup (on_submitted_work_done_sync is broken in
    # wgpu-py 0.32's binding).
    done = device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
    device.queue.read_buffer(done, 0, 4)


def bindings_of(shape: Any) -> dict[int, list[int]]:
    """group -> binding numbers of a reflected kernel (wgsl_reflect.KernelShape)."""
    found: dict[int, list[int]] = {}
    for binding in shape.bindings:
        found.setdefault(binding.group, []).append(binding.binding)
    return found
