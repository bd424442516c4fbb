"""The GPU side: one adapter and device for the life of the process.

:class:`Executor` owns every wgpu object (device, pipelines, buffer pool);
nothing lives in module globals, so a process could hold several executors
(one per GPU) later. ``run(jobs)`` encodes a batch of calls into one command
encoder, submits once, waits once and hands each caller a view of its bytes
in the mapped staging buffer; ``step`` does the same for a stream of
batches, each encoded while the one before it computes (docs/executor.md).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import wgpu

from kem_port.buffer_pool import BufferPool
from kem_port.config import Config
from kem_port.dispatch import DispatchLimits, plan_dispatch
from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu_wait import wait_for_map
from kem_port.kernel_store import KernelSource
from kem_port.protocol import KernelCall
from kem_port.stats import Stats
from kem_port.wgsl_reflect import EntryPoint, KernelShape, reflect

log = logging.getLogger("kem_port.executor")

STAGING_ALIGN = 256
SMALL_RESULT = 64 * 1024  # copied out of the mapped buffer; larger ones are written from it
MIN_UNIFORM_BYTES = 256
PIPELINE_CACHE_SIZE = 256
BIND_GROUP_CACHE_SIZE = 1024
PACK_LIMIT = 256 * 1024  # inputs up to this size are packed into one upload
DEFAULT_SPIN_S = 0.002  # well under the ~10 ms a late blocking wait costs
TIMING_EVERY = 16  # with KEM_GPU_TIMING=auto, one batch in this many is timed
LOST_MARKERS = ("device lost", "devicelost", "device is lost", "context lost", "destroyed", "gpu reset")


@dataclass
class Job:
    call: KernelCall
    source: KernelSource
    reply: Callable[[memoryview], None]
    fail: Callable[[KemError], None]
    enqueued: float = field(default_factory=time.perf_counter)
    answered: bool = False

    def answer(self, view: memoryview) -> None:
        """Hand the caller its result, unless it was already answered."""
        if not self.answered:
            self.answered = True
            self.reply(view)

    def refuse(self, error: KemError) -> None:
        """Hand the caller an error, unless it was already answered."""
        if not self.answered:
            self.answered = True
            self.fail(error)


@dataclass(frozen=True)
class Pipeline:
    pipeline: wgpu.GPUComputePipeline
    layout: wgpu.GPUBindGroupLayout
    entry: EntryPoint | None
    serial: int  # never reused, unlike id(): keys the bind group cache


@dataclass
class _Prepared:
    job: Job
    pipeline: Pipeline
    groups: tuple[int, int, int]
    in_size: int
    out_size: int
    u_size: int = 0
    in_offset: int = 0
    out_offset: int = 0
    u_offset: int = 0


@dataclass
class Flight:
    """One batch from encoding to delivery. Its pooled buffers stay out of
    the pool until it lands, so the next batch encodes into others."""

    items: list[_Prepared]
    device: wgpu.GPUDevice
    pool: BufferPool
    taken: list[tuple[str, wgpu.GPUBuffer]] = field(default_factory=list)
    staging: wgpu.GPUBuffer | None = None
    timing: _Timing | None = None
    commands: wgpu.GPUCommandBuffer | None = None  # until submitted
    mapped: object = None  # the staging map's promise, once submitted
    spent: float = 0.0  # seconds spent on it in all stages, waiting included

    @property
    def jobs(self) -> list[Job]:
        return [item.job for item in self.items]

    def take(self, kind: str, size: int) -> wgpu.GPUBuffer:
        buf = self.pool.take(kind, size)
        self.taken.append((kind, buf))
        return buf


def _pad4(n: int) -> int:
    return (n + 3) & ~3


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def is_device_lost(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in LOST_MARKERS)


def choose_adapter(selector: str | None) -> wgpu.GPUAdapter:
    """KEM_ADAPTER picks by index or name substring; else high-performance, else any."""
    if selector:
        adapters = wgpu.gpu.enumerate_adapters_sync()
        if selector.isdigit():
            index = int(selector)
            if index < len(adapters):
                return adapters[index]
        else:
            wanted = selector.lower()
            for adapter in adapters:
                info = adapter.info
                names = " ".join(str(info.get(k, "")) for k in ("device", "description", "vendor", "adapter_type"))
                if wanted in names.lower():
                    return adapter
        listing = "; ".join(f"{i}: {a.info.get('device')}" for i, a in enumerate(adapters))
        raise KemError("no_adapter", f"KEM_ADAPTER={selector!r} matches none of: {listing or 'no adapters'}")
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        adapter = wgpu.gpu.request_adapter_sync(force_fallback_adapter=True)
    if adapter is None:
        raise KemError("no_adapter", "wgpu found no adapter (install mesa-vulkan-drivers for a CPU adapter)")
    return adapter


class Executor:
    def __init__(self, config: Config, stats: Stats) -> None:
        self.config = config
        self.stats = stats
        self.adapter: wgpu.GPUAdapter | None = None
        self.device: wgpu.GPUDevice | None = None
        self.pool: BufferPool | None = None
        self._pipelines: OrderedDict[tuple, Pipeline] = OrderedDict()
        self._shapes: dict[str, KernelShape] = {}
        self.binding_limit = 0
        self.uniform_limit = 0
        self.dispatch_limits = DispatchLimits()
        self.info: dict = {}
        self._query_set = None
        self._bind_groups: OrderedDict[tuple, wgpu.GPUBindGroup] = OrderedDict()
        self._serial = 0
        self.storage_align = 256
        self.uniform_align = 256
        self.spin_s = 0.0
        self._batch_count = 0

    # -- life cycle -------------------------------------------------------

    def open(self) -> None:
        started = time.perf_counter()
        self.adapter = choose_adapter(self.config.adapter)
        limits = self.adapter.limits
        wanted = {
            name: limits[name]
            for name in (
                "max-storage-buffer-binding-size",
                "max-buffer-size",
                "max-compute-workgroups-per-dimension",
                "max-uniform-buffer-binding-size",
                "max-compute-invocations-per-workgroup",
                "max-compute-workgroup-size-x",
                "max-compute-workgroup-size-y",
                "max-compute-workgroup-size-z",
            )
            if name in limits
        }
        features = ["timestamp-query"] if self._want_timing() else []
        self.spin_s = self._spin_budget()
        self.device = self.adapter.request_device_sync(required_limits=wanted, required_features=features, label="kem")
        # One query set for the device's life: creating one per batch cost
        # ~250 us a small call on lavapipe.
        self._query_set = self.device.create_query_set(type="timestamp", count=2) if features else None
        max_buffer = int(limits["max-buffer-size"])
        self.binding_limit = min(int(limits["max-storage-buffer-binding-size"]), max_buffer)
        self.uniform_limit = int(limits["max-uniform-buffer-binding-size"])
        self.dispatch_limits = DispatchLimits(int(limits["max-compute-workgroups-per-dimension"]))
        self.pool = BufferPool(self.device, self.config.pool_bytes, max_buffer)
        self._pipelines.clear()
        self._bind_groups.clear()
        self.storage_align = max(STAGING_ALIGN, int(limits["min-storage-buffer-offset-alignment"]))
        self.uniform_align = max(STAGING_ALIGN, int(limits["min-uniform-buffer-offset-alignment"]))
        self.info = self._describe_adapter()
        self.stats.add_time("device_open", time.perf_counter() - started)
        log.info("using %s (%s)", self.info["name"], self.info["backend"])

    def _want_timing(self) -> bool:
        """GPU timestamps: on real GPUs by default (sampled, _time_this_batch).
        On lavapipe they cost ~170 us of a ~700 us small call, so auto leaves
        them off there."""
        assert self.adapter is not None
        if self.config.gpu_timing == "off" or "timestamp-query" not in self.adapter.features:
            return False
        return self.config.gpu_timing == "on" or self.adapter.info.get("adapter_type") != "CPU"

    def _time_this_batch(self) -> bool:
        """KEM_GPU_TIMING=on times every batch; auto one in TIMING_EVERY
        (the queries and their resolve are three more native calls)."""
        if self._query_set is None:
            return False
        self._batch_count += 1
        return self.config.gpu_timing == "on" or self._batch_count % TIMING_EVERY == 1

    def _spin_budget(self) -> float:
        """Seconds to spin before a blocking wait (gpu_wait.py): none on
        CPU adapters by default, whose driver threads share our cores."""
        assert self.adapter is not None
        if self.config.poll_spin_us is not None:
            return self.config.poll_spin_us / 1e6
        return 0.0 if self.adapter.info.get("adapter_type") == "CPU" else DEFAULT_SPIN_S

    def rebuild(self) -> None:
        """After device loss: a new adapter, device, pool and pipeline cache."""
        self.stats.inc("device_rebuilds")
        old = self.device
        self.device = None
        self.pool = None
        self._query_set = None
        self._pipelines.clear()
        self._bind_groups.clear()
        try:
            if old is not None:
                old.destroy()
        except Exception:  # the old device may already be gone
            pass
        self.open()

    def _describe_adapter(self) -> dict:
        assert self.adapter is not None
        info = self.adapter.info
        limits = self.adapter.limits
        return {
            "name": info.get("device", ""),
            "vendor": info.get("vendor", "") or str(info.get("vendor_id", "")),
            "device": str(info.get("device_id", "")),
            "driver": info.get("description", ""),
            "backend": info.get("backend_type", ""),
            "driver_info": info.get("description", ""),
            "adapter_type": info.get("adapter_type", ""),
            "vendor_id": info.get("vendor_id", 0),
            "device_id": info.get("device_id", 0),
            "limits": {
                "max_storage_buffer_binding_size": int(limits["max-storage-buffer-binding-size"]),
                "max_buffer_size": int(limits["max-buffer-size"]),
                "max_compute_workgroups_per_dimension": int(limits["max-compute-workgroups-per-dimension"]),
                "max_uniform_buffer_binding_size": int(limits["max-uniform-buffer-binding-size"]),
                "max_output_bytes": self.config.max_output_bytes,
                "max_input_bytes": self.config.max_input_bytes,
            },
        }

    def adapter_info_json(self, extra: dict | None = None) -> bytes:
        data = dict(self.info)
        if extra:
            data.update(extra)
        return json.dumps(data, sort_keys=True).encode()

    # -- preparation: everything that can fail for one caller alone ------

    def _shape(self, source: KernelSource) -> KernelShape:
        shape = self._shapes.get(source.sha256)
        if shape is None:
            shape = self._shapes[source.sha256] = reflect(source.text)
        return shape

    @staticmethod
    def _pipeline_key(source: KernelSource, call: KernelCall) -> tuple[str, str, bool]:
        return (source.sha256, call.entry_point, call.params is not None)

    def is_warm(self, source: KernelSource, call: KernelCall) -> bool:
        """Whether a call would find its device open and pipeline compiled."""
        return self.device is not None and self._pipeline_key(source, call) in self._pipelines

    def pipeline_for(self, source: KernelSource, call: KernelCall) -> Pipeline:
        key = self._pipeline_key(source, call)
        found = self._pipelines.get(key)
        if found is not None:
            self._pipelines.move_to_end(key)
            self.stats.inc("pipeline_hits")
            return found
        self.stats.inc("pipeline_misses")
        shape = self._shape(source)
        entry = check_layout(shape, call)
        started = time.perf_counter()
        pipeline = self._compile(source, call.entry_point, shape, call.params is not None)
        elapsed = time.perf_counter() - started
        self.stats.inc("compiles")
        self.stats.add_time("compile", elapsed)
        log.info("compiled %s:%s in %.1f ms", source.kernel_id, call.entry_point, elapsed * 1e3)
        self._serial += 1
        result = Pipeline(pipeline[0], pipeline[1], entry, self._serial)
        self._pipelines[key] = result
        while len(self._pipelines) > PIPELINE_CACHE_SIZE:
            self._pipelines.popitem(last=False)
        return result

    def _compile(self, source: KernelSource, entry: str, shape: KernelShape, has_params: bool):
        device = self._require_device()
        try:
            module = device.create_shader_module(code=source.text, label=source.kernel_id)
        except wgpu.GPUError as exc:
            raise KemError("shader_error", _naga_message(exc)) from None
        input_binding = shape.binding(0, 0)
        input_type = "storage" if input_binding is not None and input_binding.access == "read_write" else "read-only-storage"
        entries = [
            {"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": input_type}},
            {"binding": 1, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "storage"}},
        ]
        if has_params:
            entries.append({"binding": 2, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": "uniform"}})
        try:
            layout = device.create_bind_group_layout(entries=entries)
            pipeline_layout = device.create_pipeline_layout(bind_group_layouts=[layout])
            pipeline = device.create_compute_pipeline(
                layout=pipeline_layout, compute={"module": module, "entry_point": entry}
            )
        except wgpu.GPUError as exc:
            raise KemError("bad_kernel", _naga_message(exc)) from None
        return pipeline, layout

    def _require_device(self) -> wgpu.GPUDevice:
        if self.device is None:
            raise KemError("no_adapter", "the GPU device is not available")
        return self.device

    def prepare(self, job: Job) -> _Prepared:
        call = job.call
        in_size = max(_pad4(len(call.input)), 4)
        out_size = _pad4(call.output_size)
        for what, size in (("input", in_size), ("output", out_size)):
            if size > self.binding_limit:
                raise too_large(
                    f"{what} of {size} bytes is over this adapter's storage binding limit of {self.binding_limit}"
                )
        if call.params is not None and _align(len(call.params), 16) > self.uniform_limit:
            raise too_large(f"params of {len(call.params)} bytes exceed the uniform limit {self.uniform_limit}")
        pipeline = self.pipeline_for(job.source, call)
        groups = plan_dispatch(pipeline.entry, call.output_size, call.param_words, call.workgroups, self.dispatch_limits)
        u_size = max(_align(len(call.params), 16), MIN_UNIFORM_BYTES) if call.params is not None else 0
        return _Prepared(job, pipeline, groups, in_size, out_size, u_size)

    # -- running batches --------------------------------------------------
    #
    # A batch goes through four stages: encode (buffers, upload, commands),
    # submit (one submit and the staging map), wait (gpu_wait.py) and
    # deliver (each caller's slice of the mapped staging). step() overlaps
    # two batches: the next one is encoded while the previous one computes,
    # and the previous one is delivered while the next one computes. The
    # next batch is submitted only after the previous one's wait, because
    # wgpu-py's blocking poll waits for everything submitted (it passes no
    # submission index).

    def run(self, jobs: list[Job]) -> None:
        """Run jobs to the end; each job is answered exactly once."""
        flight = self.step(None, jobs)
        while flight is not None:
            flight = self.step(flight, [])

    def step(self, previous: Flight | None, jobs: list[Job]) -> Flight | None:
        """Encode jobs while `previous` is on the GPU, land `previous`, and
        return the new batch, submitted and still in flight (or None).

        `previous` always lands here: every one of its callers has been
        answered when step returns.
        """
        ready = self._prepare_all(jobs)
        flight: Flight | None = None
        if ready:
            try:
                flight = self._encode(ready)
            except Exception as exc:
                self._land(previous)
                previous = None
                self._recover(ready, exc)
        if previous is not None and not self._wait(previous):
            if flight is not None and self.device is not flight.device:
                self._fail_flight(flight, KemError("device_lost", "the GPU device was lost before this batch ran"))
                flight = None
            previous = None
        if flight is not None:
            try:
                self._submit(flight)
            except Exception as exc:
                self._land(previous)
                previous = None
                self._release(flight)
                self._recover(flight.items, exc)
                flight = None
        if previous is not None:
            self._deliver_flight(previous)
        return flight

    def _land(self, flight: Flight | None) -> None:
        """Wait for a submitted batch and answer its callers."""
        if flight is not None and self._wait(flight):
            self._deliver_flight(flight)

    def _prepare_all(self, jobs: list[Job]) -> list[_Prepared]:
        """Check and compile for each call; a call that fails alone is answered now."""
        if not jobs:
            return []
        if self.device is None:
            try:
                self.open()
            except Exception as exc:  # report, keep serving non-GPU calls
                error = exc if isinstance(exc, KemError) else KemError("no_adapter", str(exc))
                for job in jobs:
                    job.refuse(error)
                return []
        ready: list[_Prepared] = []
        for job in jobs:
            if job.call.output_size == 0:
                job.answer(memoryview(b""))
                continue
            try:
                ready.append(self.prepare(job))
            except KemError as exc:
                job.refuse(exc)
            except wgpu.GPUError as exc:
                self._gpu_failure([job], exc)
        return ready

    def _recover(self, items: list[_Prepared], exc: BaseException) -> None:
        """A batch failed as a whole (nothing in flight now): if the device
        lives, run each call alone so one bad call cannot fail the others."""
        if len(items) == 1 or is_device_lost(exc):
            self._gpu_failure([i.job for i in items], exc)
            return
        for item in items:
            self.run([item.job])  # a batch of one: its failure is its own

    def _gpu_failure(self, jobs: list[Job], exc: BaseException) -> None:
        if is_device_lost(exc):
            log.error("device lost: %s; rebuilding", exc)
            for job in jobs:
                job.refuse(KemError("device_lost", f"the GPU device was lost: {_naga_message(exc)}"))
            try:
                self.rebuild()
            except Exception as rebuild_exc:
                log.error("rebuild failed: %s", rebuild_exc)
                self.device = None
            return
        for job in jobs:
            job.refuse(KemError("gpu_error", _naga_message(exc)))

    def _encode(self, items: list[_Prepared]) -> Flight:
        """Buffers, upload and commands for one batch, not yet submitted.

        wgpu-py costs ~20 us per native call on these machines, more than a
        small kernel, so the batch is laid out to need few of them: all
        inputs in one buffer (one upload for the small ones), all outputs in
        one buffer (one clear, one copy to staging), params in one uniform
        buffer, every dispatch in one compute pass. Per call that leaves a
        bind group (cached), set_bind_group and dispatch.
        """
        device = self._require_device()
        pool = self.pool
        assert pool is not None
        started = time.perf_counter()
        for item in items:
            self.stats.add_time("queue_wait", started - item.job.enqueued)
        plan = _BatchPlan(items, self.storage_align, self.uniform_align)
        flight = Flight(items, device, pool)
        try:
            in_buf = flight.take("input", plan.in_total)
            out_buf = flight.take("output", plan.out_total)
            u_buf = flight.take("uniform", plan.u_total) if plan.u_total else None
            timing = _Timing(self._query_set, plan.out_total) if self._time_this_batch() else None
            if timing is not None:
                timing.resolved = flight.take("query", timing.size)
            flight.staging = flight.take("staging", plan.out_total + (_align(timing.size, STAGING_ALIGN) if timing else 0))
            flight.timing = timing
            plan.upload(device.queue, in_buf, u_buf)
            encoder = device.create_command_encoder()
            # Pooled buffers hold earlier callers' bytes: clear what this
            # batch binds, so a kernel that skips elements returns zeros.
            encoder.clear_buffer(out_buf, 0, plan.out_total)
            compute = encoder.begin_compute_pass(timestamp_writes=timing.writes()) if timing else encoder.begin_compute_pass()
            current = None
            for item in items:
                if item.pipeline is not current:
                    compute.set_pipeline(item.pipeline.pipeline)
                    current = item.pipeline
                compute.set_bind_group(0, self._bind_group(device, item, in_buf, out_buf, u_buf))
                compute.dispatch_workgroups(*item.groups)
            compute.end()
            encoder.copy_buffer_to_buffer(out_buf, 0, flight.staging, 0, plan.out_total)
            if timing is not None:
                timing.resolve(encoder, flight.staging)
            flight.commands = encoder.finish()
        except BaseException:
            self._release(flight)
            raise
        self.stats.inc("bytes_in", sum(len(item.job.call.input) for item in items))
        self._stage_done(flight, "upload_encode", started)
        return flight

    def _submit(self, flight: Flight) -> None:
        started = time.perf_counter()
        flight.device.queue.submit([flight.commands])
        flight.commands = None
        flight.mapped = flight.staging.map_async("READ_NOSYNC", 0, flight.staging.size)
        self._stage_done(flight, "submit", started)

    def _wait(self, flight: Flight) -> bool:
        """Block until the batch is done and its staging mapped. False (and
        every caller answered) when it failed."""
        started = time.perf_counter()
        try:
            wait_for_map(flight.device, flight.mapped, self.spin_s)
        except Exception as exc:
            self._release(flight)
            self._gpu_failure(flight.jobs, exc)
            return False
        self._stage_done(flight, "gpu_wait", started)
        return True

    def _deliver_flight(self, flight: Flight) -> None:
        """Answer each caller from its slice of the mapped staging buffer."""
        started = time.perf_counter()
        later: list[tuple[Job, bytes]] = []
        try:
            # One view of the whole mapped range (each read_mapped is a
            # native call); every caller's result is a slice of it.
            mapped_view = flight.staging.read_mapped(0, flight.staging.size, copy=False)
            for item in flight.items:
                size = item.job.call.output_size
                view = mapped_view[item.out_offset : item.out_offset + size]
                if size <= SMALL_RESULT:
                    later.append((item.job, bytes(view)))
                else:
                    # Large: straight from mapped memory to the pipe.
                    self._answer(item.job, view)
            if flight.timing is not None:
                self.stats.add_time("gpu_kernel", flight.timing.read(mapped_view))
                self.stats.inc("gpu_kernel_samples", len(flight.items))
            flight.staging.unmap()
        except Exception as exc:
            self._fail_flight(flight, KemError("gpu_error", f"reading the results failed: {_naga_message(exc)}"))
            return
        self._release(flight)
        self.stats.batch(len(flight.items))
        # Small results go out last, once this thread's bookkeeping is done:
        # the caller's next request then finds the GPU thread already
        # waiting instead of competing with it for the GIL.
        for job, data in later:
            self._answer(job, memoryview(data))
        self._stage_done(flight, "readback", started)

    def _stage_done(self, flight: Flight, stage: str, started: float) -> None:
        """A stage's time goes to the batch (the batch sizer's cost) and to stats."""
        elapsed = time.perf_counter() - started
        flight.spent += elapsed
        self.stats.add_time(stage, elapsed)

    def _fail_flight(self, flight: Flight, error: KemError) -> None:
        self._release(flight)
        for job in flight.jobs:
            job.refuse(error)

    def _release(self, flight: Flight) -> None:
        """Buffers go back to the pool that lent them (after a rebuild, an
        old pool that nobody uses any more)."""
        for kind, buf in flight.taken:
            flight.pool.give(kind, buf)
        flight.taken = []

    def _bind_group(self, device, item: _Prepared, in_buf, out_buf, u_buf):
        """Bind groups are cached by buffer serial, offsets and sizes: steady
        traffic (same pooled buffers, same shapes) creates none."""
        call = item.job.call
        key = (
            item.pipeline.serial, in_buf.kem_serial, item.in_offset, item.in_size,
            out_buf.kem_serial, item.out_offset, item.out_size,
            u_buf.kem_serial if call.params is not None else 0, item.u_offset, item.u_size,
        )
        group = self._bind_groups.get(key)
        if group is not None:
            self._bind_groups.move_to_end(key)
            self.stats.inc("bind_group_hits")
            return group
        entries = [
            {"binding": 0, "resource": {"buffer": in_buf, "offset": item.in_offset, "size": item.in_size}},
            {"binding": 1, "resource": {"buffer": out_buf, "offset": item.out_offset, "size": item.out_size}},
        ]
        if call.params is not None:
            entries.append({"binding": 2, "resource": {"buffer": u_buf, "offset": item.u_offset, "size": item.u_size}})
        group = device.create_bind_group(layout=item.pipeline.layout, entries=entries)
        self._bind_groups[key] = group
        while len(self._bind_groups) > BIND_GROUP_CACHE_SIZE:
            self._bind_groups.popitem(last=False)
        return group

    def _answer(self, job: Job, view: memoryview) -> None:
        self.stats.inc("bytes_out", len(view))
        job.answer(view)

    def describe(self) -> dict:
        extra = {"pipelines_cached": len(self._pipelines)}
        if self.pool is not None:
            extra.update(self.pool.describe())
        return extra

    def destroy_device_for_test(self) -> None:
        """Test hook: lose the device as a driver reset would."""
        if self.device is not None:
            self.device.destroy()


class _Timing:
    """GPU timestamps at the start and end of the batch's compute pass
    (timestamp-query), resolved and copied behind the results in the
    staging buffer, so they come back with the map the batch already does.
    """

    size = 16

    def __init__(self, query_set, offset: int) -> None:
        self.offset = offset
        self.query_set = query_set
        self.resolved = None  # a pooled buffer the flight takes

    def writes(self) -> dict:
        return {"query_set": self.query_set, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}

    def resolve(self, encoder, staging) -> None:
        encoder.resolve_query_set(self.query_set, 0, 2, self.resolved, 0)
        encoder.copy_buffer_to_buffer(self.resolved, 0, staging, self.offset, self.size)

    def read(self, mapped: memoryview) -> float:
        """Seconds of GPU time for the batch's pass, from the mapped staging."""
        begin, end = mapped[self.offset : self.offset + self.size].cast("Q")
        return max(0, end - begin) / 1e9


class _BatchPlan:
    """Where each call's input, output and params sit in the batch's shared
    buffers (offsets aligned for binding), and the upload of them."""

    def __init__(self, items: list[_Prepared], storage_align: int, uniform_align: int) -> None:
        self.items = items
        # Small inputs first, so the packed upload covers them and nothing else.
        self.small = [i for i in items if len(i.job.call.input) <= PACK_LIMIT]
        self.large = [i for i in items if len(i.job.call.input) > PACK_LIMIT]
        in_total = out_total = u_total = 0
        for item in self.small + self.large:
            item.in_offset, in_total = in_total, in_total + _align(item.in_size, storage_align)
        self.small_end = self.small[-1].in_offset + self.small[-1].in_size if self.small else 0
        for item in items:
            item.out_offset, out_total = out_total, out_total + _align(item.out_size, storage_align)
            if item.u_size:
                item.u_offset, u_total = u_total, u_total + _align(item.u_size, uniform_align)
        self.in_total, self.out_total, self.u_total = in_total, out_total, u_total

    def upload(self, queue, in_buf, u_buf) -> None:
        """Small inputs and all params go up as one write each, zero-padded;
        large inputs are written from the caller's bytes without a copy."""
        if self.small:
            packed = bytearray(self.small_end)
            for item in self.small:
                packed[item.in_offset : item.in_offset + len(item.job.call.input)] = item.job.call.input
            queue.write_buffer(in_buf, 0, packed)
        for item in self.large:
            _write_padded(queue, in_buf, item.job.call.input, item.in_offset, item.in_size)
        if self.u_total:
            params = bytearray(self.u_total)
            for item in self.items:
                if item.job.call.params is not None:
                    params[item.u_offset : item.u_offset + len(item.job.call.params)] = item.job.call.params
            queue.write_buffer(u_buf, 0, params)


def _write_padded(queue, buf, data: bytes, offset: int, padded: int) -> None:
    """Upload data at offset and zero the bytes up to `padded`, without
    copying data (write_buffer reads the caller's buffer directly)."""
    body = len(data) // 4 * 4
    if body:
        queue.write_buffer(buf, offset, data, 0, body)
    tail = padded - body
    if tail:
        queue.write_buffer(buf, offset + body, bytes(data[body:]) + bytes(tail - (len(data) - body)))


def check_layout(shape: KernelShape, call: KernelCall) -> EntryPoint | None:
    """The kernel must fit kem's contract: group 0, bindings 0-1 (and 2 with params)."""
    entry = shape.entry_points.get(call.entry_point)
    if shape.entry_points and entry is None:
        raise KemError("bad_kernel", f"no entry point {call.entry_point!r} (found {', '.join(shape.entry_points)})")
    if entry is not None and entry.stage not in (None, "compute"):
        raise KemError("bad_kernel", f"entry point {call.entry_point!r} is a {entry.stage} shader, not @compute")
    if not shape.bindings:
        return entry
    extra = [b for b in shape.bindings if b.group != 0 or b.binding not in (0, 1, 2)]
    if extra:
        b = extra[0]
        raise KemError("bad_kernel", f"{b.name} at @group({b.group}) @binding({b.binding}): kem binds only group 0, bindings 0-2")
    output = shape.binding(0, 1)
    if output is None or output.address_space != "storage" or output.access != "read_write":
        raise KemError("bad_kernel", "binding 1 must be the output: var<storage, read_write>")
    inp = shape.binding(0, 0)
    if inp is None or inp.address_space != "storage":
        raise KemError("bad_kernel", "binding 0 must be the input: var<storage, read>")
    uniform = shape.binding(0, 2)
    if uniform is not None and uniform.address_space != "uniform":
        raise KemError("bad_kernel", "binding 2 must be the params: var<uniform>")
    if call.params is not None and uniform is None:
        raise bad_args("params given, but the kernel declares no @binding(2) var<uniform>")
    if call.params is None and uniform is not None:
        raise bad_args("the kernel reads params (@binding(2)); call it with params")
    return entry


def _naga_message(exc: BaseException) -> str:
    text = str(exc).strip()
    return text[:4000] if text else type(exc).__name__
