"""``python -m kem_port.admission.worker``: a disposable process that compiles
kernels nobody has compiled before, so that a kernel which crashes, exhausts
or hangs the shader compiler takes down this process, never the port.

It opens its own device on the port's adapter, probes it for workgroup
memory that leaks between dispatches, then sets its resource limits and
answers requests one at a time over its pipes (``{packet,4}`` frames of
JSON): ``{"code", "entry", "has_params", "kernel_id"[, "constants"]}`` ->
``{"ok": true}`` or ``{"ok": false, "reason", "detail"}``. It runs the same
``create_shader_module`` + ``create_compute_pipeline`` the port will.

Limits (admission/guard.py reads the way the worker died):
* stack: each compile runs on a thread of COMPILE_STACK_BYTES, half of the
  8 MiB that the port's threads get, so what compiled here has room there;
* memory: RLIMIT_DATA at what the open device uses plus the budget.
  RLIMIT_AS does not fit: the driver alone maps 1.2 GB of address space on
  lavapipe (VmSize after open, VmData ~0.2 GB), far more on NVIDIA;
* CPU time: RLIMIT_CPU's soft limit, reset before each compile to the CPU
  time used so far plus KEM_COMPILE_CPU_S, so each compile has the same
  budget however long the worker lived (a lifetime limit would one day kill
  a valid kernel's compile). CPU time, not wall time, decides: load steals
  wall time from a compile but cannot make it burn CPU. SIGXCPU kills.
"""

from kem_port.wire.stdio_guard import claim_protocol_fds

import json
import math
import os
import resource
import signal
import sys
import time
import threading
from typing import Any

COMPILE_STACK_BYTES = 4 << 20


def _vm_data_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def limit_resources(memory_bytes: int) -> None:
    data = _vm_data_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def budget_cpu(seconds: int) -> None:
    """The next compile may burn `seconds` of CPU (all of this process's
    threads: llvmpipe's JIT and dispatch included), whatever came before.
    Only the soft limit moves: a process may not raise its hard limit."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def compile_kernel(device: Any, request: dict) -> dict:
    import wgpu

    try:
        module = device.create_shader_module(code=request["code"])
    except wgpu.GPUError as exc:
        from kem_port.gpu.pipelines import named_shader
        return {"ok": False, "reason": "shader_error", "detail": named_shader(str(exc)[:4000], str(request.get("kernel_id", "kernel")))}
    from kem_port.admission.first_dispatch import bindings_of, dispatch_once
    from kem_port.gpu.contract import layout_entries
    from kem_port.gpu.pipelines import compute_stage
    from kem_port.gpu.wgsl.wgsl_reflect import reflect
    from kem_port.gpu import gas_meter
    from kem_port.gpu.wgsl.wgsl_gas import metered

    try:
        shape = reflect(request["code"])
        if request.get("layout") == "auto":
            # A session or chain kernel binds named buffers beyond kem's
            # three (gpu/session_contract.py): the shader's own layout.
            layout, bindings = "auto", bindings_of(shape)
        else:  # the very layout the port builds (gpu/pipelines.py)
            entries = layout_entries(shape, bool(request["has_params"]))
            layouts = [device.create_bind_group_layout(entries=entries)]
            bindings = {0: [entry["binding"] for entry in entries]}
            if metered(shape):  # the gas group, as gpu/pipelines.py adds it (cap 0 in a first dispatch)
                gas = gas_meter.layout_entries()
                layouts.append(device.create_bind_group_layout(entries=gas))
                bindings[1] = [entry["binding"] for entry in gas]
            layout = device.create_pipeline_layout(bind_group_layouts=layouts)
        stage = compute_stage(module, request["entry"], request.get("constants"))  # as gpu/pipelines.py builds it
        pipeline = device.create_compute_pipeline(layout=layout, compute=stage)
    except wgpu.GPUError as exc:
        return {"ok": False, "reason": "bad_kernel", "detail": str(exc)[:4000]}
    if request.get("first_dispatch"):
        try:
            dispatch_once(device, pipeline, bindings)  # admission/first_dispatch.py: lavapipe compiles here
        except wgpu.GPUError:
            pass  # a binding larger than the probe's: admitted as before
    return {"ok": True}


def on_small_stack(fn, *args) -> Any:
    """fn(*args) on a fresh thread with COMPILE_STACK_BYTES of stack."""
    result: list[Any] = []
    old = threading.stack_size(COMPILE_STACK_BYTES)
    try:
        thread = threading.Thread(target=lambda: result.append(fn(*args)), name="kem-compile")
        thread.start()
    finally:
        threading.stack_size(old)
    thread.join()
    if not result:
        return {"ok": False, "reason": "internal", "detail": "the compile thread failed"}
    return result[0]


def serve(in_fd: int, out_fd: int) -> int:
    from kem_port.wire.framing import FrameWriter, read_frame
    from kem_port.admission.first_dispatch import compiles_at_dispatch
    from kem_port.admission.probe import open_device, workgroup_memory_leaks

    writer = FrameWriter(out_fd)
    adapter, device = open_device(os.environ.get("KEM_ADAPTER") or None)
    at_dispatch = compiles_at_dispatch(adapter.info)
    hello = {"ready": True, "adapter": adapter.info.get("device", ""), "leaks_workgroup": workgroup_memory_leaks(device)}
    limit_resources(int(os.environ.get("KEM_COMPILE_MEMORY_MB", "1024")) << 20)
    cpu_s = int(os.environ.get("KEM_COMPILE_CPU_S", "20"))
    writer.write([json.dumps(hello).encode()])
    broken = False
    while True:
        frame = read_frame(in_fd, 16 << 20)
        if frame is None:
            return 0
        request = json.loads(frame)
        request["first_dispatch"] = at_dispatch
        if request.get("test_fail") and os.environ.get("KEM_TEST_HOOKS") == "1":
            broken = fail_for_test(str(request["test_fail"]))
        if broken:
            reply = {"ok": False, "reason": "bad_kernel", "detail": "the worker was broken by a test hook"}
        else:
            budget_cpu(cpu_s)
            reply = on_small_stack(compile_kernel, device, request)
        writer.write([json.dumps(reply).encode()])


def fail_for_test(fault: str) -> bool:
    """KEM_TEST_HOOKS=1 only: fail this compile as a loaded node or a worn
    worker may (test_hooks.py's fail_next_compile). True: "break", every
    compile of this worker fails from now on (the guard's health probe too)."""
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "stall":
        time.sleep(3600)  # past any deadline: the guard kills this worker
    return fault == "break"


def main() -> int:
    from kem_port.wire.stdio_guard import exit_on_hangup

    in_fd, out_fd = claim_protocol_fds()
    # Not die_with_parent: Linux ties that to the thread that started us, and
    # the guard starts workers from short-lived threads. The port's end of
    # our stdin closes when it dies, even while we are inside a compile.
    exit_on_hangup(in_fd)
    return serve(in_fd, out_fd)


if __name__ == "__main__":
    sys.exit(main())
