"""A lone call's road: the kits of one executor, one per call shape.

When the reader runs a lone small call (port/lone_call.py: the GPU
thread idle, nothing queued), the batch road built a batch of one: a
preparer, a plan, a flight, four pooled buffers, a packed upload, an
encoder object, a bind group key, a map object with a new cffi handle,
stats under their lock a dozen times; ~35 us of a ~150 us call on
lavapipe. Here a call finds its shape's kit (gpu/lone_kit.py: kernel
pipeline, input, output and params sizes) in a small LRU and runs on it.

**Why a second submission code.** One road would run a lone call as a
batch of one (Executor.step); the kit is kept beside it because it buys
far more than the 10% that would justify it: on the lent H100, in one
process and interleaved (scripts/bench_lone.py --router, issue 28), the
batch of one took 294-336 us p50 and the kit 88-104 us, and the port's
whole lone call 110-133 us on the kit. Everything else (groups, slot
forms, call tables) is a plan on the batch road.

**Checks.** A kit is built by the batch road's own ``plan.prepare``
(binding limits, the pipeline and its params size, the call table, the
dispatch), whose verdict depends on the shape alone, so a kit's calls pass
it by construction; the one exception, a dispatch planned from the params'
words (a 2-D kernel's image size), is planned again on every call. A
failure is raised to the executor, which applies its rules
(``Executor.run_lone``: the caller's own error, or a GPU failure; device
loss rebuilds, and the kits go with the old device).

**One call at a time.** A kit's buffers are never used by two calls at
once: the road runs only for a caller that holds the executor's lock (port/lone_call.py, GpuLoop.run_held)
for the whole call, and a call returns only once its
kit's staging buffer is read and unmapped (or the call failed and its kit
was dropped); the GPU thread's batches take the same lock and never touch
a kit (they use the pool). The road also holds a lock of its own, taken
without waiting, across a call: a second caller that got here any other
way takes the batch road instead. tests/test_lone_kit.py checks both.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import wgpu

from kem_port.gpu.calls import Job
from kem_port.gpu.device import Device
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.gas_meter import invocations
from kem_port.gpu.lone_kit import Kit
from kem_port.gpu.native import NativePath
from kem_port.gpu.pipelines import Pipelines
from kem_port.gpu.plan import prepare
from kem_port.gpu.wgsl.wgsl_calls import may_loop
from kem_port.stats import Stats

KIT_LIMIT = 64 * 1024  # inputs and outputs up to this size get a kit (run_inline's SMALL_CALL)
# Shapes kept. A kit holds at most ~3 x 64 KiB of buffers; a port serving
# a few hot kernels needs a few kits; 16 bounds the memory at ~3 MiB.
KITS = 16

_NO_KIT = object()  # a shape that takes the batch road (a call-table kernel)

class LoneRoad:
    """The kits of one executor and the call that runs on them."""

    def __init__(self, gpu: Device, pipelines: Pipelines, stats: Stats) -> None:
        self.gpu = gpu
        self.pipelines = pipelines
        self.stats = stats
        self._kits: OrderedDict[tuple, Kit | object] = OrderedDict()
        self._device: wgpu.GPUDevice | None = None  # the device the kits were made on
        self._path: NativePath | None = None
        self._zeros: Any = None
        self._busy = threading.Lock()  # one call on the kits at a time, whoever calls
        self._last: tuple = ()  # run_known's kit and stage stamps, for count_known

    def __len__(self) -> int:
        return sum(1 for kit in self._kits.values() if kit is not _NO_KIT)

    def clear(self) -> None:
        """Forget every kit (the device is being replaced, or a call failed)."""
        kits, self._kits = self._kits, OrderedDict()
        for kit in kits.values():
            if kit is not _NO_KIT:
                kit.retire()

    def run(self, job: Job) -> bool:
        """Run a lone call on its shape's kit and answer it; False (nothing
        done) when it must take the batch road instead. Raises what the
        call's checks or native calls raise: the executor decides what a
        failure means (Executor.run_lone)."""
        call = job.call
        if not (
            call.workgroups is None and call.grid is None and call.constants is None  # the kit keys on neither
            and call.gas_limit is None  # its check is plan.prepare's (gas_meter.launch_slot)
            and not call.debug and call.output_path is None
            and 0 < call.output_size <= KIT_LIMIT and type(call.input) is bytes and len(call.input) <= KIT_LIMIT
        ):
            return False
        if not self._busy.acquire(blocking=False):
            return False
        try:
            return self._run(job, call)
        finally:
            self._busy.release()

    def _run(self, job: Job, call) -> bool:
        started = time.perf_counter()
        if self.gpu.device is not self._device and not self._reopen():
            return False
        params = call.params
        key = (job.source.sha256, call.entry_point, len(call.input), call.output_size, -1 if params is None else len(params))
        kit = self._kits.get(key)
        fresh = kit is None
        if fresh:
            kit = self._build(key, job)
        elif kit is not _NO_KIT:
            self._kits.move_to_end(key)
        if kit is _NO_KIT:
            return False
        groups = kit.groups
        if kit.groups_from_params:
            groups = plan_dispatch(kit.entry, call.output_size, call.param_words, None, kit.limits)
        result, stamps = self._call(kit, key, call.input, params, groups)
        if call.usage:  # a kit's kernel has no loop: its gas is what it launched (docs/metering.md)
            job.gas = invocations(kit.entry, groups)
        job.answer(memoryview(result))
        self._count((), job.enqueued, kit, fresh, started, *stamps)
        return True

    def run_known(self, key: tuple, data: bytes) -> bytes | None:
        """The reader's hot lone call (port/lone_call.py): its result off a kit already
        built for its shape (`key` as _run makes it, no params) on the
        current device, or None with nothing done (no such kit, the device
        changed, a call already on the road): the caller then takes the
        road through run. Raises what run raises; count_known counts it
        once the reply is written. No Job: the caller answers."""
        kit = self._kits.get(key)
        if kit is None or kit is _NO_KIT or self.gpu.device is not self._device or not self._busy.acquire(blocking=False):
            return None
        try:
            self._kits.move_to_end(key)
            started = time.perf_counter()
            result, stamps = self._call(kit, key, data, None, kit.groups)
            self._last = (kit, started, *stamps)
            return result
        finally:
            self._busy.release()

    def known_gas(self) -> int:
        """The last run_known call's gas: what its kit launched (a kit's
        kernel has no loop), for a call that asked (docs/metering.md)."""
        kit = self._last[0]
        return invocations(kit.entry, kit.groups)

    def count_known(self, extra: tuple[tuple[str, int], ...]) -> None:
        """Count the last run_known call as run counts one (it waited in no
        queue), with the caller's `extra` counters under the same lock."""
        kit, started, encoded, submitted, waited, blocked = self._last
        self._count(extra, started, kit, False, started, encoded, submitted, waited, blocked)

    def _call(self, kit: Kit, key: tuple, data: bytes, params: bytes | None, groups: tuple[int, int, int]) -> tuple[bytes, tuple]:
        """The call's native calls on its kit: the result and when each stage
        ended. A failure drops the kit (its state is then unknown) and is raised."""
        errors = self._path.errors
        try:
            errors.call(kit.encode, data, params, groups)
        except BaseException:
            kit.discard()
            self._drop(key)
            raise
        encoded = time.perf_counter()
        try:
            index = errors.call(kit.submit)
            submitted = time.perf_counter()
            blocked = kit.wait(self.gpu.lone_spin_s, index)
            waited = time.perf_counter()
            result = errors.call(kit.read)
        except BaseException:
            self._drop(key)
            raise
        return result, (encoded, submitted, waited, blocked)

    def _count(self, extra: tuple, enqueued: float, kit: Kit, fresh: bool, started: float, encoded: float, submitted: float,
               waited: float, blocked: bool) -> None:
        """The batch road's counters and stage timers for this call (and
        the caller's `extra` counters), under one acquisition of the stats
        lock (a kit's first call counted its pipeline hit in prepare, and
        made its bind group)."""
        done = time.perf_counter()
        self.stats.bump(
            (("lone_kit_calls", 1), ("pipeline_hits", not fresh), ("bind_group_hits", not fresh), ("bytes_in", kit.in_len),
             ("bytes_out", kit.out_len), ("gpu_waits_blocked", blocked), *extra),
            (("queue_wait", started - enqueued), ("upload_encode", encoded - started), ("submit", submitted - encoded),
             ("gpu_wait", waited - submitted), ("readback", done - waited)),
            batch_size=1,
        )

    def _reopen(self) -> bool:
        """The device changed (opened, rebuilt, closed): the kits of the old
        one go; kits run on the C-API path only (gpu/hot_path.py)."""
        self.clear()
        self._device = self.gpu.device
        self._path = None
        if self._device is None:
            return False
        path = self.gpu.hot
        if not isinstance(path, NativePath):
            return False
        self._path = path
        self._zeros = path.ffi.new("uint8_t[]", KIT_LIMIT)
        return True

    def _build(self, key: tuple, job: Job) -> Kit | object:
        """The kit of a new shape, made by the batch road's own checks
        (a KemError here is the caller's, and no kit is kept)."""
        if self._path is None:
            return _NO_KIT
        prepared = prepare(job, self.gpu, self.pipelines)
        # A kernel that may loop never gets a kit: kits run only on the
        # reader, which such a kernel could hold (port/lone_call.py).
        if prepared.pipeline.tabled or may_loop(job.source.text, job.source.sha256, job.call.entry_point):
            kit: Kit | object = _NO_KIT
        else:
            kit = Kit(self._path, self.gpu.require(), prepared, job.call, self.gpu.dispatch_limits, self._zeros)
            self.stats.inc("lone_kits_built")
        self._kits[key] = kit
        while len(self._kits) > KITS:
            _, old = self._kits.popitem(last=False)
            if old is not _NO_KIT:
                old.retire()
        return kit

    def _drop(self, key: tuple) -> None:
        kit = self._kits.pop(key, None)
        if kit is not None and kit is not _NO_KIT:
            kit.retire()
