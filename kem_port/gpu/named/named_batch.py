"""Named-buffer calls of one kernel, queued together, in one submission.

Calls by named buffers that wait in the GPU queue behind each other, for
the same kernel and entry point (port/gpu_loop.py gathers them), run as
the batch road runs kem@1.0 calls: every call's bytes written, one
encoder (its outputs cleared, one compute pass holding each call's
dispatch on its own bind groups, every call's copies to one staging
buffer), one submit, one map, one wait. Each call keeps its own
kit -- its own buffers, so the calls of a submission share no byte -- and
its own gas meter. Two calls of one signature need two kits: the second
takes a replica of the first's (named_run.py keeps up to REPLICAS small
ones); a call with no kit to spare runs alone after the batch.

A road beside the executor's batch road (whose packed plans bind kem@1.0's
layout only): paid for by 64 callers of named calls on the H100, 3.3k and
3.1k calls/s before, 14.3k and 13.4k with it, same sitting, runs
alternating (docs/benchmarks.md, "Roads side by side"; `scripts/bench roads`).
"""

from __future__ import annotations

import wgpu

from kem_port.gpu.named.binding_model import Bound
from kem_port.gpu.named.named_kit import NamedKit
from kem_port.gpu.hot_path import read_each
from kem_port.gpu.native import NativePath
from kem_port.gpu.wgpu_private import handle

# (its kit, its pipeline, its bindings, its bytes in binding order, its workgroups, its gas cap)
Run = tuple[NamedKit, wgpu.GPUComputePipeline, list[Bound], list, tuple[int, int, int], int]


def run_together(path: NativePath, runs: list[Run], spin_s: float,
                 staging: wgpu.GPUBuffer | None = None) -> list[tuple[dict[str, bytes], tuple | None]]:
    """Each run's returned buffers by name and its meter's words, after one
    submission; a wgpu.GPUError fails them all (their kits' state is then
    unknown: the caller drops them). With ``staging`` (at least
    staging_bytes(runs)), every copy lands there and one map reads them all;
    else each kit's own staging is mapped."""
    bases = _bases(runs)
    target = None if staging is None else handle(staging)
    commands = path.errors.call(_encode, path, runs, target, bases)
    index = path.submit(commands)
    if staging is not None:
        mapping = path.map_read(staging, 0, bases[-1])
        path.wait(mapping, spin_s, index)
        try:
            view = path.mapped(staging, 0, bases[-1])
            return [kit.parse(view, base, bound) for (kit, _, bound, *_), base in zip(runs, bases)]
        finally:
            path.unmap(staging)
    return read_each(path, [(kit.staging, kit.staging_size, lambda kit=kit, bound=bound: kit.read(path, bound))
                            for kit, _, bound, *_ in runs], spin_s, index)


def staging_bytes(runs: list[Run]) -> int:
    """What one staging buffer for every run's copies holds."""
    return _bases(runs)[-1]


def _bases(runs: list[Run]) -> list[int]:
    """Where each run's copies start in a batch's staging, then the end."""
    bases = [0]
    for kit, *_ in runs:
        bases.append(bases[-1] + kit.staging_size)  # whole words: every base stays 4-aligned, as copies need
    return bases


def _encode(path: NativePath, runs: list[Run], staging, bases: list[int]):
    """Writes, clears, one pass of every dispatch, copies: the command buffer."""
    lib = path.lib
    for kit, _, bound, datas, _, cap in runs:
        kit.write_native(path, bound, datas, cap)
    encoder = lib.wgpuDeviceCreateCommandEncoder(path.device_handle, path.encoder_desc)
    try:
        for kit, *_ in runs:
            kit.clear_native(lib, encoder)
        compute = lib.wgpuCommandEncoderBeginComputePass(encoder, path.pass_desc)
        for kit, pipeline, _, _, groups, _ in runs:
            kit.dispatch_native(path, compute, pipeline, groups)
        lib.wgpuComputePassEncoderEnd(compute)
        lib.wgpuComputePassEncoderRelease(compute)
        for (kit, *_), base in zip(runs, bases):
            kit.copy_native(lib, encoder, staging, base)
        return lib.wgpuCommandEncoderFinish(encoder, path.command_desc)
    finally:
        lib.wgpuCommandEncoderRelease(encoder)
