"""A batch's stages: encode, submit, wait, read back. Each raises on failure;
gpu/executor.py decides what a failure means for the callers.

The native calls go through the device's hot path (gpu/hot_path.py:
wgpu-native's C API, or wgpu-py's objects as the fallback). Through
wgpu-py's objects a native call cost ~20 us here, more than a small
kernel, so a batch is laid out to need few of them: all inputs in one
buffer (one upload for the small ones), all outputs in one buffer (zeroed
once, one copy to staging), params in one uniform buffer, every dispatch
in one compute pass. Per call that leaves a bind group (cached),
set_bind_group and dispatch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import wgpu

from kem_port.gpu import gas_meter
from kem_port.gpu.buffer_pool import BufferPool
from kem_port.gpu.group import call_table
from kem_port.gpu.group.group_stage import canary_fill, dispatch_slots, dispatch_table, gather, slots_intact
from kem_port.gpu.calls import BatchCost, Job
from kem_port.gpu.device import STAGING_ALIGN, Device
from kem_port.gpu.hot_path import HotPath
from kem_port.gpu.pipelines import NO_BINDING, Pipelines
from kem_port.gpu.plan import BatchPlan, Prepared
from kem_port.gpu.timing import Timing
from kem_port.gpu.wgpu_private import serial_of
from kem_port.gpu.contract import align
from kem_port.stats import Stats

SMALL_RESULT = 64 * 1024  # copied out of the mapped buffer; larger ones are written from it
# Outputs up to this size are zeroed by a queue write rather than a clear
# command: the write rides in the queue's pending writes that the input's
# upload already makes, where the clear adds a command and its barriers. On
# lavapipe, one process, interleaved, two runs each: a lone 4-byte call on
# the bare C API 63 -> 57 us p50, through the executor 130 -> 127 and
# 144 -> 141 us. Larger outputs are cleared on the GPU (no host zeros to copy).
ZERO_WRITE_LIMIT = 64 * 1024
_ZEROS = memoryview(bytes(ZERO_WRITE_LIMIT))


@dataclass
class Flight:
    """One batch from encoding to delivery. Its pooled buffers stay out of
    the pool until it lands, so the next batch encodes into others."""

    items: list[Prepared]
    device: wgpu.GPUDevice
    pool: BufferPool
    hot: HotPath  # the native calls of the device it was encoded on
    taken: list[tuple[str, wgpu.GPUBuffer]] = field(default_factory=list)
    staging: wgpu.GPUBuffer | None = None
    timing: Timing | None = None
    commands: wgpu.GPUCommandBuffer | None = None  # until submitted
    mapped: object = None  # the staging map's promise, once submitted
    index: int | None = None  # its submission index, where the path has one
    spin_s: float = 0.0  # how long its wait spins before blocking (gpu/device.py)
    spent: float = 0.0  # seconds spent on it in all stages, waiting included
    largest_call_bytes: int = 0  # its largest call's batch_bytes, found while encoding

    @property
    def jobs(self) -> list[Job]:
        return [item.job for item in self.items]

    @property
    def calls(self) -> int:
        """Callers in the batch (a group job counts its slots)."""
        return sum(item.job.calls for item in self.items)

    def cost(self) -> BatchCost:
        return BatchCost(self.calls, self.spent, self.largest_call_bytes)

    def take(self, kind: str, size: int) -> wgpu.GPUBuffer:
        buf = self.pool.take(kind, size)
        self.taken.append((kind, buf))
        return buf

    def release(self) -> None:
        """Buffers go back to the pool that lent them (after a rebuild, an
        old pool that nobody uses any more)."""
        if self.commands is not None:  # encoded, never submitted
            self.hot.discard(self.commands)
            self.commands = None
        for kind, buf in self.taken:
            self.pool.give(kind, buf)
        self.taken = []


class Stages:
    def __init__(self, device: Device, pipelines: Pipelines, stats: Stats, sharing: call_table.Sharing = call_table.NO_SHARING) -> None:
        self.device = device
        self.pipelines = pipelines
        self.stats = stats
        self.sharing = sharing  # which call-table kernels' calls may share a dispatch

    def encode(self, items: list[Prepared], lone: bool = False) -> Flight:
        """Buffers, upload and commands for one batch, not yet submitted.
        A lone call (one the reader runs inline) waits with the lone spin."""
        device = self.device.require()
        pool = self.device.pool
        assert pool is not None
        started = time.perf_counter()
        # One pass over the calls for the batch's stats and the largest call
        # (what cost() reports to the batch sizer): that took a generator
        # per call in cost() on the GPU thread. One stats update each (each
        # takes the stats lock).
        waited = 0.0
        bytes_in = largest = 0
        for item in items:
            call = item.job.call
            waited += (started - item.job.enqueued) * item.job.calls
            size = len(call.input)
            bytes_in += size * item.job.calls
            if size > largest or call.output_size > largest:
                largest = max(size, call.output_size)
        self.stats.add_time("queue_wait", waited)
        plan = BatchPlan(
            items, self.device.storage_align, self.device.uniform_align,
            self.device.binding_limit, self.device.dispatch_limits.max_per_dimension, self.sharing,
        )
        flight = Flight(items, device, pool, self.device.hot, largest_call_bytes=largest)
        flight.spin_s = self.device.lone_spin_s if lone else self.device.spin_s
        try:
            self._record(flight, plan)
        except BaseException:
            flight.release()
            raise
        self.stats.inc("bytes_in", bytes_in)
        self._stage_done(flight, "upload_encode", started)
        return flight

    def _record(self, flight: Flight, plan: BatchPlan) -> None:
        device = flight.device
        in_buf = flight.take("input", plan.in_total)
        out_buf = flight.take("output", plan.out_total)
        u_buf = flight.take("uniform", plan.u_total) if plan.u_total else None
        t_buf = flight.take("table", plan.t_total) if plan.t_total else None
        timing = self.device.timer.for_batch(plan.out_total)
        if timing is not None:
            timing.resolved = flight.take("query", timing.size)
        flight.staging = flight.take("staging", plan.out_total + (align(timing.size, STAGING_ALIGN) if timing else 0))
        flight.timing = timing
        copies = plan.upload(flight.hot, in_buf, u_buf, t_buf, flight.take)
        encoder = flight.hot.encoder()
        try:
            for upload, offset, size in copies:
                encoder.copy(upload, 0, in_buf, offset, size)
            _clear_outputs(flight, encoder, plan, out_buf)
            encoder.begin_pass(timing.query_set if timing else None)
            self._dispatch_plain(encoder, device, plan, in_buf, out_buf, u_buf)
            current = None  # the pipeline set last
            for table in plan.groups:
                current = dispatch_table(encoder, device, self.pipelines, table, (in_buf, out_buf, t_buf, u_buf), current, self.device.dispatch_limits.max_per_dimension)
            if plan.groups:  # (a group job of a call-table kernel always makes one)
                self.stats.inc("table_dispatches", len(plan.groups))
                self.stats.inc("table_calls", sum(table.calls for table in plan.groups))
                self.stats.inc("table_group_jobs", plan.group_tables)
            encoder.end_pass()
            encoder.copy(out_buf, 0, flight.staging, 0, plan.out_total)
            if timing is not None:
                timing.resolve(encoder, flight.staging)
            flight.commands = encoder.finish()
        finally:
            encoder.abandon()

    def _dispatch_plain(self, encoder, device, plan: BatchPlan, in_buf, out_buf, u_buf) -> None:
        """One dispatch per plain call, each with its bind group (cached).

        The group keys are built here from serials read once per batch, and
        the cache hits counted once per batch: through Pipelines.bind_group
        (three serial lookups, three tuples and a stats lock per call) this
        loop cost ~4.4 us a call at 64 small calls a batch on lavapipe, now
        ~3.3 (scripts/batch_curve.py --stages 64, encode stage, runs alternating with the
        commit before)."""
        pipelines = self.pipelines
        in_serial, out_serial = serial_of(in_buf), serial_of(out_buf)
        u_serial = serial_of(u_buf) if u_buf is not None else 0
        set_bind_group, dispatch = encoder.set_bind_group, encoder.dispatch
        current = None
        hits = 0
        for item in plan.plain:
            pipeline = item.pipeline
            if pipeline is not current:
                encoder.set_pipeline(pipeline.pipeline)
                current = pipeline
            if item.job.calls > 1:  # a group job: a dispatch per live slot
                hits += dispatch_slots(encoder, pipelines, device, item, in_buf, out_buf, in_serial, out_serial, self.device.binding_limit)
                current = None  # its slot form may have set another pipeline
                continue
            with_params = item.job.call.params is not None
            key = (
                pipeline.serial, in_serial, item.in_offset, item.in_size, out_serial, item.out_offset, item.out_size,
                *((u_serial, item.u_offset, item.u_size) if with_params else NO_BINDING), *NO_BINDING,
            )
            group = pipelines.cached_bind_group(key)
            if group is None:
                params = (u_buf, item.u_offset, item.u_size) if with_params else None
                group = pipelines.new_bind_group(
                    key, device, pipeline, (in_buf, item.in_offset, item.in_size), (out_buf, item.out_offset, item.out_size), params
                )
            else:
                hits += 1
            set_bind_group(group)
            if item.gas is not None:
                gas_meter.bind(encoder, device, pipelines, pipeline.gas_layout, item.gas, u_buf, out_buf, (u_serial, out_serial))
            dispatch(*item.groups)
        if hits:
            self.stats.inc("bind_group_hits", hits)

    def submit(self, flight: Flight) -> None:
        started = time.perf_counter()
        commands, flight.commands = flight.commands, None
        flight.index = flight.hot.submit(commands)
        flight.mapped = flight.hot.map_read(flight.staging, 0, flight.staging.size)
        self._stage_done(flight, "submit", started)

    def wait(self, flight: Flight) -> None:
        """Block until the batch is done and its staging mapped."""
        started = time.perf_counter()
        if flight.hot.wait(flight.mapped, flight.spin_s, flight.index):
            # The spin gave up (or there was none): on NVIDIA a blocking
            # poll can return ~10 ms late, so this count is the first
            # suspect of a latency tail (docs/executor.md).
            self.stats.inc("gpu_waits_blocked")
        self._stage_done(flight, "gpu_wait", started)

    def read(self, flight: Flight) -> list[tuple[Job, bytes]]:
        """Answer large results straight from mapped memory to the pipe; return
        copies of the small ones, to be answered once the flight is released."""
        later: list[tuple[Job, bytes]] = []
        # One view of the whole mapped range (each read_mapped is a
        # native call); every caller's result is a slice of it.
        mapped_view = flight.hot.mapped(flight.staging, 0, flight.staging.size)
        if flight.timing is not None:  # counted before any answer: a caller's next stats call sees its kernel's time
            self.stats.add_time("gpu_kernel", flight.timing.read(mapped_view))
            self.stats.inc("gpu_kernel_samples", flight.calls)
        for item in flight.items:
            size = item.job.call.output_size
            if item.gas is not None and gas_meter.refused(mapped_view, item.job, item.gas):  # ran out: gas_exhausted
                continue
            if item.job.call.usage:  # the node asked for its gas (docs/metering.md)
                item.job.gas = gas_meter.used(mapped_view, item)
            if item.job.calls > 1:
                outputs = gather(mapped_view, item)  # first: the canaries share its cache lines
                if slots_intact(mapped_view, item, self.pipelines):  # else failed, its slot form retired
                    later.append((item.job, outputs))
                continue
            view = mapped_view[item.out_offset : item.out_offset + size]
            if size <= SMALL_RESULT:
                later.append((item.job, bytes(view)))
            else:
                self.stats.inc("bytes_out", size)
                item.job.answer(view)
        flight.hot.unmap(flight.staging)
        return later

    def answer_all(self, answers: list[tuple[Job, bytes]]) -> None:
        """Hand each caller its small result; one stats update for all."""
        self.stats.inc("bytes_out", sum(len(data) for _, data in answers))
        for job, data in answers:
            job.answer(memoryview(data))

    def _stage_done(self, flight: Flight, stage: str, started: float) -> None:
        """A stage's time goes to the batch (the batch sizer's cost) and to stats."""
        elapsed = time.perf_counter() - started
        flight.spent += elapsed
        self.stats.add_time(stage, elapsed)


def _clear_outputs(flight: Flight, encoder, plan: BatchPlan, out_buf) -> None:
    """Clear what this batch binds (pooled buffers hold earlier callers'
    bytes); a plain group's range gets its canaries (group_stage.py). A
    clear command runs after every queue write: cleared around them."""
    marked = [(item.out_offset, canary_fill(item)) for item in plan.plain if item.job.calls > 1]
    if plan.out_total <= ZERO_WRITE_LIMIT:
        flight.hot.write(out_buf, 0, _ZEROS[: plan.out_total])
    else:
        at = 0
        for offset, fill in marked:  # in output order, as plain items are laid out
            if offset > at:
                encoder.clear_buffer(out_buf, at, offset - at)
            at = offset + len(fill)
        if at < plan.out_total:
            encoder.clear_buffer(out_buf, at, plan.out_total - at)
    for offset, fill in marked:
        flight.hot.write(out_buf, offset, fill)
