"""A chain kit's encoder commands as bare C-API calls (gpu/session/chain_kit.py).

A kit's commands never change, so on the C-API path (gpu/native.py) they
are turned once into (target, function, arguments) with every native
handle looked up, and a run is one loop of C calls, as a lone call's kit
runs (gpu/lone_kit.py). Through NativeEncoder's methods each command was
a Python method call and a handle lookup: ~1 us apiece, ~35 of them for a
chain of ten 4-byte `double` steps on lavapipe (clears, passes, bind
groups, dispatches, copies). On wgpu-py's objects (the fallback path) the
commands run through the encoder's methods instead.
"""

from __future__ import annotations

from typing import Any

from kem_port.gpu.native import NativePath
from kem_port.gpu.wgpu_private import handle

ENCODER, PASS, BEGIN, END = range(4)


def compile_commands(path: NativePath, ops: list[tuple[str, tuple]]) -> list[tuple[int, Any, tuple]]:
    """ops (encoder method name, arguments) as C calls on raw handles."""
    lib, null = path.lib, path.ffi.NULL
    out: list[tuple[int, Any, tuple]] = []
    for name, args in ops:
        if name == "begin_pass":
            out.append((BEGIN, None, ()))
        elif name == "end_pass":
            out.append((END, None, ()))
        elif name == "set_pipeline":
            out.append((PASS, lib.wgpuComputePassEncoderSetPipeline, (handle(args[0]),)))
        elif name == "set_bind_group":
            out.append((PASS, lib.wgpuComputePassEncoderSetBindGroup, (args[1], handle(args[0]), 0, null)))
        elif name == "dispatch":
            out.append((PASS, lib.wgpuComputePassEncoderDispatchWorkgroups, tuple(args)))
        elif name == "copy":
            src, src_offset, dst, dst_offset, size = args
            out.append((ENCODER, lib.wgpuCommandEncoderCopyBufferToBuffer, (handle(src), src_offset, handle(dst), dst_offset, size)))
        elif name == "clear_buffer":
            buf, offset, size = args
            out.append((ENCODER, lib.wgpuCommandEncoderClearBuffer, (handle(buf), offset, size)))
        else:
            raise ValueError(f"no C call for encoder command {name!r}")
    return out


def encode_native(path: NativePath, kits: list[list[tuple[int, Any, tuple]]]) -> Any:
    """One command buffer of each kit's commands in turn (one kit's, or a
    batch's: chain_batch.py); submit it with path.submit. Errors recorded
    while encoding come at finish, as wgpu.GPUError."""
    lib = path.lib
    encoder = path.errors.call(lib.wgpuDeviceCreateCommandEncoder, path.device_handle, path.encoder_desc)
    compute = None
    try:
        for target, call, args in (command for commands in kits for command in commands):
            if target is ENCODER:
                call(encoder, *args)
            elif target is PASS:
                call(compute, *args)
            elif target is BEGIN:
                compute = lib.wgpuCommandEncoderBeginComputePass(encoder, path.pass_desc)
            else:
                lib.wgpuComputePassEncoderEnd(compute)
                lib.wgpuComputePassEncoderRelease(compute)
                compute = None
        return path.errors.call(lib.wgpuCommandEncoderFinish, encoder, path.command_desc)
    finally:
        if compute is not None:
            lib.wgpuComputePassEncoderRelease(compute)
        lib.wgpuCommandEncoderRelease(encoder)


def encode_wrapped(encoder, ops: list[tuple[str, tuple]]) -> Any:
    """The same commands through a hot-path encoder's methods (gpu/hot_path.py)."""
    try:
        for name, args in ops:
            getattr(encoder, name)(*args)
        return encoder.finish()
    except BaseException:
        encoder.abandon()
        raise
