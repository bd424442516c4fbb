"""One call in debug mode: the kernel's debug channel bound and read back.

A kernel may declare ``@group(0) @binding(15) var<storage, read_write>
kem_debug: KemDebug`` (``struct KemDebug { count: atomic<u32>, records:
array<u32> }``) and append u32 records to it (docs/debug.md). In debug mode
(``debug => true``) kem binds a buffer of ``RECORDS`` records, zeroed, runs
the call alone, outside the batches (debug calls are rare and must not
change the hot path), and returns the records kept and how many did not
fit beside the result.
"""

from __future__ import annotations

import struct

import wgpu

from kem_port.gpu import contract, gas_meter
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.gpu.calls import Job
from kem_port.transfer.file_inputs import FILE_INPUTS, FileInput, FileParts
from kem_port.gpu.executor import Executor
from kem_port.gpu.plan import prepare

RECORDS = 4096  # u32 records kept per call (16 KiB); the rest are counted as dropped
DEBUG_BYTES = 4 * (1 + RECORDS)  # the count, then the records


def _padded(data: bytes, size: int) -> bytes:
    return bytes(data) + bytes(size - len(data))


def _input_bytes(data: bytes | memoryview | FileInput | FileParts) -> bytes | memoryview | bytearray:
    """The call's input in memory: one still in its shared-memory file(s)
    is read now (bad_args if it shrank)."""
    if isinstance(data, FILE_INPUTS):
        buf = bytearray(len(data))
        data.read_into(memoryview(buf))
        return buf
    return data


def run_debug(executor: Executor, job: Job) -> tuple[bytes, dict]:
    """Run job's call with the debug channel; return (output, debug) where
    debug is ``{"records": [u32...], "dropped": n, "capacity": RECORDS,
    "gas": g}`` (the call's gas, docs/metering.md: a way to read it today)."""
    call, device = job.call, executor.gpu.require()
    # The checks, compile and dispatch any call gets (limits, explicit workgroups' bound).
    item = prepare(job, executor.gpu, executor.pipelines)
    pipeline, groups = item.pipeline, item.groups
    usage = wgpu.BufferUsage
    in_size, out_size = item.in_size, max(item.out_size, 4)
    inputs = device.create_buffer_with_data(data=_padded(_input_bytes(call.input), in_size), usage=usage.STORAGE)
    outputs = device.create_buffer(size=out_size, usage=usage.STORAGE | usage.COPY_SRC)
    params = None
    if call.params is not None:
        params = (device.create_buffer_with_data(data=_padded(call.params, item.u_size), usage=usage.UNIFORM), 0, item.u_size)
    debug = device.create_buffer_with_data(data=bytes(DEBUG_BYTES), usage=usage.STORAGE | usage.COPY_SRC)
    entries = contract.group_entries((inputs, 0, in_size), (outputs, 0, out_size), params)
    if pipeline.debugged:  # a kernel without the channel runs as usual, with no records
        entries.append(contract.debug_entry(debug, DEBUG_BYTES))
    group = device.create_bind_group(layout=pipeline.layout, entries=entries)
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline.pipeline)
    compute.set_bind_group(0, group)
    meter = _bind_gas(device, compute, pipeline, item.gas)
    compute.dispatch_workgroups(*groups)
    compute.end()
    device.queue.submit([encoder.finish()])
    gas = gas_meter.invocations(pipeline.entry, groups)  # a kernel without a loop: what it launched
    if meter is not None:
        gas = gas_meter.check(memoryview(device.queue.read_buffer(meter)), item.gas)
    result = bytes(device.queue.read_buffer(outputs)[: call.output_size])
    return result, decode_records(bytes(device.queue.read_buffer(debug))) | {"gas": gas}


def _bind_gas(device, compute, pipeline, slot: gas_meter.GasSlot | None):
    """A metered kernel's cap and meter (offsets 0: buffers of their own); the meter buffer, or None."""
    if slot is None:
        return None
    usage = wgpu.BufferUsage
    cap = device.create_buffer_with_data(data=slot.cap.to_bytes(4, "little") + bytes(12), usage=usage.UNIFORM)
    meter = device.create_buffer_with_data(data=bytes(16), usage=usage.STORAGE | usage.COPY_SRC)
    compute.set_bind_group(wgsl_gas.GROUP, device.create_bind_group(layout=pipeline.gas_layout, entries=[
        {"binding": wgsl_gas.CAP_BINDING, "resource": {"buffer": cap}},
        {"binding": wgsl_gas.METER_BINDING, "resource": {"buffer": meter}}]))
    return meter


def decode_records(raw: bytes) -> dict:
    (count,) = struct.unpack_from("<I", raw)
    kept = min(count, RECORDS)
    return {"records": list(struct.unpack_from(f"<{kept}I", raw, 4)), "dropped": count - kept, "capacity": RECORDS}
