"""Runs a kernel's gas form on the real adapter, as the port binds it:
the kernel's input and output at group 0, the cap and meter at the gas
group (gpu/wgsl/wgsl_gas.py). Used by tests/test_gas.py."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import wgpu

from kem_port.gpu import gas_meter
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.gpu.wgsl.wgsl_canonical import canonical


@lru_cache(maxsize=1)
def device() -> wgpu.GPUDevice:
    return wgpu.utils.get_default_device()


def run(text: str, data: np.ndarray, out_words: int, workgroups: int, cap: int, wg_size: int = 64,
        entry: str = "main", meter_start: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, tuple[int, bool], wgsl_gas.GasForm]:
    """(output words, (gas, ran out), form) of one dispatch of text's gas form."""
    dev = device()
    form = wgsl_gas.gas_form(canonical(text))
    module = dev.create_shader_module(code=form.text)
    layouts = [_layout(dev, ("read-only-storage", "storage"))]
    if form.metered:
        layouts.append(_layout(dev, ("uniform", "storage")))
    pipeline = dev.create_compute_pipeline(layout=dev.create_pipeline_layout(bind_group_layouts=layouts),
                                           compute={"module": module, "entry_point": entry})
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    inp = dev.create_buffer_with_data(data=np.ascontiguousarray(data), usage=usage)
    out = dev.create_buffer(size=max(4, out_words * 4), usage=usage)
    groups = [dev.create_bind_group(layout=layouts[0], entries=[
        {"binding": 0, "resource": {"buffer": inp}}, {"binding": 1, "resource": {"buffer": out}}])]
    meter = None
    if form.metered:
        cap_buf = dev.create_buffer_with_data(data=np.array([cap, 0, 0, 0], np.uint32), usage=wgpu.BufferUsage.UNIFORM)
        meter = dev.create_buffer_with_data(data=np.array([*meter_start, 0, 0], np.uint32), usage=usage)
        groups.append(dev.create_bind_group(layout=layouts[wgsl_gas.GROUP], entries=[
            {"binding": wgsl_gas.CAP_BINDING, "resource": {"buffer": cap_buf}},
            {"binding": wgsl_gas.METER_BINDING, "resource": {"buffer": meter}}]))
    encoder = dev.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    for index, group in enumerate(groups):
        compute.set_bind_group(index, group)
    compute.dispatch_workgroups(workgroups)
    compute.end()
    dev.queue.submit([encoder.finish()])
    result = np.frombuffer(dev.queue.read_buffer(out), np.uint32).copy()
    invocations = workgroups * wg_size
    words = np.frombuffer(dev.queue.read_buffer(meter), np.uint32).tolist() if meter else [0, 0, 0, 0]
    return result, gas_meter.meter_gas(words, invocations), form


def _layout(dev: wgpu.GPUDevice, kinds: tuple[str, str]) -> wgpu.GPUBindGroupLayout:
    """An explicit layout, as the port's (an auto one drops a binding the entry point does not use)."""
    return dev.create_bind_group_layout(entries=[
        {"binding": index, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}} for index, kind in enumerate(kinds)])
