"""Laying out a batch: each call checked and given its pipeline and
workgroups (:func:`prepare`), then placed in the batch's shared buffers
(:class:`BatchPlan`) and uploaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from kem_port.gpu import contract
from kem_port.gpu.calls import Job
from kem_port.gpu.device import Device
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.pipelines import Pipeline, Pipelines

PACK_LIMIT = 256 * 1024  # inputs up to this size are packed into one upload


@dataclass
class Prepared:
    job: Job
    pipeline: Pipeline
    groups: tuple[int, int, int]
    in_size: int
    out_size: int
    u_size: int = 0
    in_offset: int = 0
    out_offset: int = 0
    u_offset: int = 0


def prepare(job: Job, device: Device, pipelines: Pipelines) -> Prepared:
    """Everything that can fail for one caller alone: limits, compile, dispatch."""
    call = job.call
    contract.check_sizes(call, device.binding_limit, device.uniform_limit)
    pipeline = pipelines.get(device.require(), job.source, call)
    groups = plan_dispatch(pipeline.entry, call.output_size, call.param_words, call.workgroups, device.dispatch_limits)
    return Prepared(
        job, pipeline, groups,
        contract.input_binding_size(call), contract.output_binding_size(call), contract.params_binding_size(call),
    )


class BatchPlan:
    """Where each call's input, output and params sit in the batch's shared
    buffers (offsets aligned for binding), and the upload of them."""

    def __init__(self, items: list[Prepared], storage_align: int, uniform_align: int) -> None:
        self.items = items
        # Small inputs first, so the packed upload covers them and nothing else.
        self.small = [i for i in items if len(i.job.call.input) <= PACK_LIMIT]
        self.large = [i for i in items if len(i.job.call.input) > PACK_LIMIT]
        in_total = out_total = u_total = 0
        for item in self.small + self.large:
            item.in_offset, in_total = in_total, in_total + contract.align(item.in_size, storage_align)
        self.small_end = self.small[-1].in_offset + self.small[-1].in_size if self.small else 0
        for item in items:
            item.out_offset, out_total = out_total, out_total + contract.align(item.out_size, storage_align)
            if item.u_size:
                item.u_offset, u_total = u_total, u_total + contract.align(item.u_size, uniform_align)
        self.in_total, self.out_total, self.u_total = in_total, out_total, u_total

    def upload(self, hot, in_buf, u_buf) -> None:
        """Small inputs and all params go up as one write each, zero-padded;
        large inputs are written from the caller's bytes without a copy."""
        if self.small:
            packed = bytearray(self.small_end)
            for item in self.small:
                packed[item.in_offset : item.in_offset + len(item.job.call.input)] = item.job.call.input
            hot.write(in_buf, 0, packed)
        for item in self.large:
            _write_padded(hot, in_buf, item.job.call.input, item.in_offset, item.in_size)
        if self.u_total:
            params = bytearray(self.u_total)
            for item in self.items:
                if item.job.call.params is not None:
                    params[item.u_offset : item.u_offset + len(item.job.call.params)] = item.job.call.params
            hot.write(u_buf, 0, params)


def _write_padded(hot, buf, data: bytes, offset: int, padded: int) -> None:
    """Upload data at offset and zero the bytes up to `padded`, without
    copying data (write_buffer reads the caller's buffer directly)."""
    body = len(data) // 4 * 4
    if body:
        hot.write(buf, offset, data, body)
    tail = padded - body
    if tail:
        hot.write(buf, offset + body, bytes(data[body:]) + bytes(tail - (len(data) - body)))
