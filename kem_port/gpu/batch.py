"""A batch's stages: encode, submit, wait, read back. Each raises on failure;
gpu/executor.py decides what a failure means for the callers.

wgpu-py costs ~20 us per native call on these machines, more than a small
kernel, so a batch is laid out to need few of them: all inputs in one
buffer (one upload for the small ones), all outputs in one buffer (one
clear, one copy to staging), params in one uniform buffer, every dispatch
in one compute pass. Per call that leaves a bind group (cached),
set_bind_group and dispatch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import wgpu

from kem_port.gpu.buffer_pool import BufferPool
from kem_port.gpu.calls import BatchCost, Job
from kem_port.gpu.device import STAGING_ALIGN, Device
from kem_port.gpu.pipelines import Pipelines
from kem_port.gpu.plan import BatchPlan, Prepared
from kem_port.gpu.timing import Timing
from kem_port.gpu.wait import wait_for_map
from kem_port.gpu.wgpu_private import map_for_reading_unsynced
from kem_port.gpu.contract import align
from kem_port.stats import Stats

SMALL_RESULT = 64 * 1024  # copied out of the mapped buffer; larger ones are written from it


@dataclass
class Flight:
    """One batch from encoding to delivery. Its pooled buffers stay out of
    the pool until it lands, so the next batch encodes into others."""

    items: list[Prepared]
    device: wgpu.GPUDevice
    pool: BufferPool
    taken: list[tuple[str, wgpu.GPUBuffer]] = field(default_factory=list)
    staging: wgpu.GPUBuffer | None = None
    timing: Timing | None = None
    commands: wgpu.GPUCommandBuffer | None = None  # until submitted
    mapped: object = None  # the staging map's promise, once submitted
    spent: float = 0.0  # seconds spent on it in all stages, waiting included

    @property
    def jobs(self) -> list[Job]:
        return [item.job for item in self.items]

    def cost(self) -> BatchCost:
        largest = max((job.call.batch_bytes for job in self.jobs), default=0)
        return BatchCost(len(self.items), self.spent, largest)

    def take(self, kind: str, size: int) -> wgpu.GPUBuffer:
        buf = self.pool.take(kind, size)
        self.taken.append((kind, buf))
        return buf

    def release(self) -> None:
        """Buffers go back to the pool that lent them (after a rebuild, an
        old pool that nobody uses any more)."""
        for kind, buf in self.taken:
            self.pool.give(kind, buf)
        self.taken = []


class Stages:
    def __init__(self, device: Device, pipelines: Pipelines, stats: Stats) -> None:
        self.device = device
        self.pipelines = pipelines
        self.stats = stats

    def encode(self, items: list[Prepared]) -> Flight:
        """Buffers, upload and commands for one batch, not yet submitted."""
        device = self.device.require()
        pool = self.device.pool
        assert pool is not None
        started = time.perf_counter()
        for item in items:
            self.stats.add_time("queue_wait", started - item.job.enqueued)
        plan = BatchPlan(items, self.device.storage_align, self.device.uniform_align)
        flight = Flight(items, device, pool)
        try:
            self._record(flight, plan)
        except BaseException:
            flight.release()
            raise
        self.stats.inc("bytes_in", sum(len(item.job.call.input) for item in items))
        self._stage_done(flight, "upload_encode", started)
        return flight

    def _record(self, flight: Flight, plan: BatchPlan) -> None:
        device = flight.device
        in_buf = flight.take("input", plan.in_total)
        out_buf = flight.take("output", plan.out_total)
        u_buf = flight.take("uniform", plan.u_total) if plan.u_total else None
        timing = self.device.timer.for_batch(plan.out_total)
        if timing is not None:
            timing.resolved = flight.take("query", timing.size)
        flight.staging = flight.take("staging", plan.out_total + (align(timing.size, STAGING_ALIGN) if timing else 0))
        flight.timing = timing
        plan.upload(device.queue, in_buf, u_buf)
        encoder = device.create_command_encoder()
        # Pooled buffers hold earlier callers' bytes: clear what this
        # batch binds, so a kernel that skips elements returns zeros.
        encoder.clear_buffer(out_buf, 0, plan.out_total)
        compute = encoder.begin_compute_pass(timestamp_writes=timing.writes()) if timing else encoder.begin_compute_pass()
        current = None
        for item in flight.items:
            if item.pipeline is not current:
                compute.set_pipeline(item.pipeline.pipeline)
                current = item.pipeline
            params = (u_buf, item.u_offset, item.u_size) if item.job.call.params is not None else None
            group = self.pipelines.bind_group(
                device, item.pipeline, (in_buf, item.in_offset, item.in_size), (out_buf, item.out_offset, item.out_size), params
            )
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*item.groups)
        compute.end()
        encoder.copy_buffer_to_buffer(out_buf, 0, flight.staging, 0, plan.out_total)
        if timing is not None:
            timing.resolve(encoder, flight.staging)
        flight.commands = encoder.finish()

    def submit(self, flight: Flight) -> None:
        started = time.perf_counter()
        flight.device.queue.submit([flight.commands])
        flight.commands = None
        flight.mapped = map_for_reading_unsynced(flight.staging, flight.staging.size)
        self._stage_done(flight, "submit", started)

    def wait(self, flight: Flight) -> None:
        """Block until the batch is done and its staging mapped."""
        started = time.perf_counter()
        wait_for_map(flight.device, flight.mapped, self.device.spin_s)
        self._stage_done(flight, "gpu_wait", started)

    def read(self, flight: Flight) -> list[tuple[Job, bytes]]:
        """Answer large results straight from mapped memory to the pipe; return
        copies of the small ones, to be answered once the flight is released."""
        later: list[tuple[Job, bytes]] = []
        # One view of the whole mapped range (each read_mapped is a
        # native call); every caller's result is a slice of it.
        mapped_view = flight.staging.read_mapped(0, flight.staging.size, copy=False)
        for item in flight.items:
            size = item.job.call.output_size
            view = mapped_view[item.out_offset : item.out_offset + size]
            if size <= SMALL_RESULT:
                later.append((item.job, bytes(view)))
            else:
                self.answer(item.job, view)
        if flight.timing is not None:
            self.stats.add_time("gpu_kernel", flight.timing.read(mapped_view))
            self.stats.inc("gpu_kernel_samples", len(flight.items))
        flight.staging.unmap()
        return later

    def answer(self, job: Job, view: memoryview) -> None:
        self.stats.inc("bytes_out", len(view))
        job.answer(view)

    def _stage_done(self, flight: Flight, stage: str, started: float) -> None:
        """A stage's time goes to the batch (the batch sizer's cost) and to stats."""
        elapsed = time.perf_counter() - started
        flight.spent += elapsed
        self.stats.add_time(stage, elapsed)
