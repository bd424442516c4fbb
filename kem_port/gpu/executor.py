"""Running jobs on one GPU, and what a failure means for their callers.

:class:`Executor` ties a :class:`~kem_port.gpu.device.Device`, its
pipeline caches and the batch stages together. ``run(jobs)`` encodes a
batch into one command encoder, submits once, waits once and hands each
caller a view of its bytes in the mapped staging buffer; ``step`` does the
same for a stream of batches, each encoded while the one before it
computes (docs/executor.md). Every job is answered exactly once.

A batch goes through four stages (gpu/batch.py): encode, submit, wait and
read back. step() overlaps two batches: the next one is encoded while the
previous one computes, and the previous one is delivered while the next
one computes. The next batch is submitted only after the previous one's
wait, because wgpu-py's blocking poll waits for everything submitted (it
passes no submission index).
"""

from __future__ import annotations

import logging
import time

import wgpu

from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.batch import Flight, Stages
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.device import Device
from kem_port.gpu.group import call_table, group_table
from kem_port.gpu.group.group_job import GroupJob
from kem_port.gpu.lone_road import LoneRoad
from kem_port.gpu.named.named_run import NamedRuns
from kem_port.gpu.pipelines import Pipelines, gpu_message
from kem_port.gpu.plan import BatchPreparer, Prepared
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

log = logging.getLogger("kem_port.gpu.executor")

LOST_MARKERS = ("device lost", "devicelost", "device is lost", "context lost", "destroyed", "gpu reset")


def is_device_lost(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in LOST_MARKERS)


class Executor:
    def __init__(self, config: Config, stats: Stats) -> None:
        self.stats = stats
        self.gpu = Device(config, stats)
        # Cross-caller coalescing (docs/dispatch.md, "Who sees what"): the slot
        # form needs both switches on; a call-table kernel shares a dispatch only when listed.
        self.sharing = call_table.Sharing.from_config(config)
        self.pipelines = Pipelines(stats, slot_dispatch=config.slot_dispatch == "on" and self.sharing.cross_caller)
        self.stages = Stages(self.gpu, self.pipelines, stats, self.sharing)
        self.lone = LoneRoad(self.gpu, self.pipelines, stats)  # a lone call's kits (gpu/lone_road.py)
        self.named = NamedRuns(self.gpu, stats)  # calls by named buffers (gpu/named/)

    # -- the device -------------------------------------------------------

    def open(self) -> None:
        self.pipelines.clear()
        self.lone.clear()
        self.gpu.open()

    def rebuild(self) -> None:
        self.pipelines.clear()
        self.lone.clear()
        self.gpu.rebuild()

    @property
    def spin_s(self) -> float:
        return self.gpu.spin_s

    @property
    def info(self) -> dict:
        return self.gpu.info

    def adapter_info_json(self, extra: dict | None = None) -> bytes:
        return self.gpu.adapter_info_json(extra)

    def is_warm(self, source: KernelSource, call: KernelCall) -> bool:
        """Whether a call would find its device open and pipeline compiled."""
        return self.gpu.device is not None and self.pipelines.has(source, call)

    def describe(self) -> dict:
        extra = {"pipelines_cached": len(self.pipelines)}
        if self.gpu.pool is not None:
            extra.update(self.gpu.pool.describe())
        return extra

    def destroy_device_for_test(self) -> None:
        self.gpu.destroy_for_test()

    # -- running batches --------------------------------------------------

    def run(self, jobs: list[Job]) -> None:
        """Run jobs to the end; each job is answered exactly once."""
        flight = self.step(None, jobs)
        while flight is not None:
            flight = self.step(flight, [])

    def step(self, previous: Flight | None, jobs: list[Job], lone: bool = False) -> Flight | None:
        """Encode jobs while `previous` is on the GPU, land `previous`, and
        return the new batch, submitted and still in flight (or None).
        `lone`: a call the reader runs alone; its wait spins longer on CPU
        adapters (gpu/device.py, LONE_SPIN_CPU_S).

        `previous` always lands here: every one of its callers has been
        answered when step returns (its cost is then ``previous.cost()``).
        """
        ready = self._prepare_all(jobs)
        flight: Flight | None = None
        if ready:
            try:
                flight = self.stages.encode(ready, lone)
            except Exception as exc:
                self._land(previous)
                previous = None
                self._recover(ready, exc)
        if previous is not None and not self._wait(previous):
            if flight is not None and self.gpu.device is not flight.device:
                self._fail_flight(flight, KemError("device_lost", "the GPU device was lost before this batch ran"))
                flight = None
            previous = None
        if flight is not None:
            try:
                self.stages.submit(flight)
            except Exception as exc:
                self._land(previous)
                previous = None
                flight.release()
                self._recover(flight.items, exc)
                flight = None
        if previous is not None:
            self._deliver(previous)
        return flight

    def run_lone(self, job: Job) -> bool:
        """A call the reader runs alone, on its shape's kit (gpu/lone_road.py);
        False (nothing done) when it must take the batch road (step). A
        failure is answered by the batch road's rules: the caller's own
        error, or a GPU failure (device loss rebuilds; the kits go too)."""
        try:
            return self.lone.run(job)
        except Exception as exc:
            lone_failed(self, job, exc)
        return True

    def _land(self, flight: Flight | None) -> None:
        """Wait for a submitted batch and answer its callers."""
        if flight is not None and self._wait(flight):
            self._deliver(flight)

    def _prepare_all(self, jobs: list[Job]) -> list[Prepared]:
        """Check and compile for each call; a call that fails alone is answered now."""
        if not jobs:
            return []
        if self.gpu.device is None:
            try:
                self.open()
            except Exception as exc:  # report, keep serving non-GPU calls
                error = exc if isinstance(exc, KemError) else KemError("no_adapter", str(exc))
                for job in jobs:
                    job.refuse(error)
                return []
        ready: list[Prepared] = []
        prepare = BatchPreparer(self.gpu, self.pipelines)
        pending = list(jobs)
        for job in pending:  # grows while it runs: a group split into its slots' jobs
            if job.call.output_size == 0:
                job.answer(memoryview(b""))
                continue
            try:
                item = prepare(job)
                if isinstance(job, GroupJob) and (item.gas is not None or item.pipeline.tabled and not group_table.fits(item, self.gpu, self.sharing.shares_table(job.call.kernel_id))):
                    # Metered (a kernel with a loop: slot forms carry no meter yet), or too large
                    # for the call table (gpu/group_table.py): the group's slots go as plain
                    # calls, each prepared (and, should that fail, answered) on its own.
                    pending.extend(job.split())
                else:
                    ready.append(item)
            except KemError as exc:
                job.refuse(exc)
            except wgpu.GPUError as exc:
                self._gpu_failure([job], exc)
        if prepare.reused:
            self.stats.inc("pipeline_hits", prepare.reused)
        return ready

    def _wait(self, flight: Flight) -> bool:
        """False (and every caller answered) when the batch failed."""
        try:
            self.stages.wait(flight)
        except Exception as exc:
            flight.release()
            self._gpu_failure(flight.jobs, exc)
            return False
        return True

    def _deliver(self, flight: Flight) -> None:
        """Answer each caller from its slice of the mapped staging buffer."""
        started = time.perf_counter()
        try:
            later = self.stages.read(flight)
        except Exception as exc:
            self._fail_flight(flight, KemError("gpu_error", f"reading the results failed: {gpu_message(exc)}"))
            return
        flight.release()
        self.stats.batch(flight.calls)
        # Small results go out last, once this thread's bookkeeping is done:
        # the caller's next request then finds the GPU thread already
        # waiting instead of competing with it for the GIL.
        self.stages.answer_all(later)
        elapsed = time.perf_counter() - started
        flight.spent += elapsed
        self.stats.add_time("readback", elapsed)

    def _recover(self, items: list[Prepared], exc: BaseException) -> None:
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
                job.refuse(KemError("device_lost", f"the GPU device was lost: {gpu_message(exc)}"))
            try:
                self.rebuild()
            except Exception as rebuild_exc:
                log.error("rebuild failed: %s", rebuild_exc)
                self.gpu.close()
            return
        for job in jobs:  # a KemError (an input file that shrank) is the caller's own
            job.refuse(exc if isinstance(exc, KemError) else KemError("gpu_error", gpu_message(exc)))

    def _fail_flight(self, flight: Flight, error: KemError) -> None:
        flight.release()
        for job in flight.jobs:
            job.refuse(error)


def lone_failed(executor: Executor, job: Job, exc: Exception) -> None:
    """A lone call's failure (Executor.run_lone, port/lone_call.py): the caller's
    own error, a GPU failure (a lost device is rebuilt, its kits go too),
    or a bug answered as gpu_loop answers one on the batch road."""
    if isinstance(exc, KemError):
        job.refuse(exc)
    elif isinstance(exc, wgpu.GPUError) or is_device_lost(exc):
        executor._gpu_failure([job], exc)
    else:
        log.exception("lone call failed")
        job.refuse(KemError("internal", f"{type(exc).__name__}: {exc}"))
