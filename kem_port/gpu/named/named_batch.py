"""Named-buffer calls of one kernel, queued together, in one submission.

Calls by named buffers that wait in the GPU queue behind each other, for
the same kernel and entry point (port/gpu_loop.py gathers them), run as
the batch road runs kem@1.0 calls: every call's bytes written, one
encoder (its outputs cleared, one compute pass holding each call's
dispatch on its own bind groups, each call's copies to its own staging),
one submit, one wait, each staging buffer read. Each call keeps its own
kit -- its own buffers, so the calls of a submission share no byte -- and
its own gas meter. Two calls of one signature need two kits: the second
takes a replica of the first's (named_run.py keeps up to REPLICAS small
ones); a call with no kit to spare runs alone after the batch.
"""

from __future__ import annotations

import wgpu

from kem_port.gpu.named.binding_model import Bound
from kem_port.gpu.named.named_kit import NamedKit
from kem_port.gpu.native import NativePath

# (its kit, its pipeline, its bindings, its bytes in binding order, its workgroups, its gas cap)
Run = tuple[NamedKit, wgpu.GPUComputePipeline, list[Bound], list, tuple[int, int, int], int]


def run_together(path: NativePath, runs: list[Run], spin_s: float) -> list[tuple[dict[str, bytes], tuple | None]]:
    """Each run's returned buffers by name and its meter's words, after one
    submission; a wgpu.GPUError fails them all (their kits' state is then
    unknown: the caller drops them)."""
    commands = path.errors.call(_encode, path, runs)
    index = path.submit(commands)
    mappings = [path.map_read(kit.staging, 0, kit.staging_size) for kit, *_ in runs]
    for mapping in mappings:
        path.wait(mapping, spin_s, index)
        index = None  # the submission is done: the other maps need only a poll
    results, failed = [], None
    for kit, _, bound, *_ in runs:  # every staging buffer unmapped, even after a failure
        try:
            results.append(kit.read(path, bound))
        except wgpu.GPUError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return results


def _encode(path: NativePath, runs: list[Run]):
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
        for kit, *_ in runs:
            kit.copy_native(lib, encoder)
        return lib.wgpuCommandEncoderFinish(encoder, path.command_desc)
    finally:
        lib.wgpuCommandEncoderRelease(encoder)
