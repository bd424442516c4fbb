"""Calls by named buffers, on the GPU thread or the reader.

A call runs on its plan (named_plan.py: made once per call signature --
every check, the pipeline with an explicit layout per group and constants
set, named_pipelines.py, and its shape's kit, named_kits.py), so a repeat
only writes its bytes: every buffer it can read overwritten or cleared, so
it never sees another call's bytes (named_kit.py). One encoder runs the
dispatch and copies every returned buffer into one staging buffer, read
after one wait, through the C-API calls the lone kem@1.0 call makes
(gpu/hot_path.py). Calls of one kernel queued together run in one
submission (run_many, named_batch.py), each on its own kit.
"""

from __future__ import annotations

from collections import OrderedDict

import wgpu

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.device import Device
from kem_port.gpu import gas_meter
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.named.binding_model import NEEDS_DISPATCH, Limits, NamedCall, check_sizes, plan_bindings
from kem_port.gpu.named import named_gas
from kem_port.gpu.named.named_gas import NamedOutputs
from kem_port.gpu.named.named_batch import run_together, staging_bytes
from kem_port.gpu.named.named_kit import NamedKit
from kem_port.gpu.named.named_kits import KIT_BYTES, NamedKits
from kem_port.gpu.native import NativePath
from kem_port.gpu.kept import SHAPE_TEXT_BYTES, Kept
from kem_port.gpu.named.named_pipelines import PIPELINES, NamedPipelines
from kem_port.gpu.named.named_plan import PLANS, NamedPlan, given_keys, signature
from kem_port.gpu.constants import pipeline_constants, resolve_entry, set_key
from kem_port.gpu.workgroup_limits import check_workgroup_limits
from kem_port.gpu.pipelines import gpu_message
from kem_port.gpu.wgsl.wgsl_calls import may_loop, used_names
from kem_port.gpu.session.chain_budget import ChainBudget
from kem_port.gpu.wgsl.wgsl_reflect import KernelShape, reflect
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

SMALL_BYTES = 64 << 10  # a lone kem@1.0 call's bytes (port/gpu_loop.SMALL_CALL)
SMALL_INVOCATIONS = SMALL_BYTES // 4  # what kem's 1-D rule dispatches for a 64 KiB output


class NamedRuns:
    """Named-buffer calls on one executor's device."""

    def __init__(self, gpu: Device, stats: Stats) -> None:
        self.gpu, self.stats = gpu, stats
        self._device: wgpu.GPUDevice | None = None
        self._pipelines = NamedPipelines(stats)  # per kernel, entry point and constants set (named_pipelines.py)
        self._shapes: Kept[KernelShape] = Kept(PIPELINES, SHAPE_TEXT_BYTES)  # filled by the reader, fetch and GPU threads
        self._kits = NamedKits()  # per call shape, and replicas for batches (named_kits.py)
        self._plans: OrderedDict[tuple, NamedPlan] = OrderedDict()  # per call signature (named_plan.py)
        self._uses: Kept[set[str] | None] = Kept(PIPELINES)  # per (kernel, entry point): the names its code reaches

    def run(self, source: KernelSource, call: NamedCall) -> NamedOutputs:
        """The call's returned buffers by WGSL name, with its gas (.gas).
        Raises KemError (gas_exhausted: a looping kernel passed its budget)."""
        self._kits.held.clear()  # none, alone (a batch whose planning raised left its own)
        plan = self._plan_of(source, call)
        result, words = self._dispatch(plan, plan.datas(call), plan.shape[:3])
        return named_gas.outputs(result, words, plan.slot, plan.invocations)

    def run_many(self, items: list[tuple[KernelSource, NamedCall]]) -> list[NamedOutputs | KemError]:
        """Calls queued together (port/gpu_loop.py gathers those of one
        kernel and entry point) in one submission (named_batch.py): each
        call's outputs, or the KemError that answers it."""
        if len(items) == 1 or not isinstance(self.gpu.hot, NativePath):  # the wrappers: one submission each
            return [self._answer(source, call) for source, call in items]
        results: list[NamedOutputs | KemError | None] = [None] * len(items)
        together: list[tuple[int, NamedPlan, NamedKit, list]] = []
        taken: dict[int, int] = {}  # kit id -> calls of this batch on that shape so far
        held = self._kits.hold()  # the shapes taken: planning a later call releases none of them (named_kits.py)
        for i, (source, call) in enumerate(items):
            try:
                plan = self._plan_of(source, call)
            except KemError as exc:
                results[i] = exc
                continue
            if plan.kit.bytes > KIT_BYTES:  # a kit made for this call alone (and released after it)
                results[i] = self._answer_plan(plan, call)
                continue
            held.add(plan.shape)
            n = taken[id(plan.kit)] = taken.get(id(plan.kit), -1) + 1
            kit = plan.kit if n == 0 else self._kits.replica(self._device, plan, n)
            if kit is not None:
                together.append((i, plan, kit, plan.datas(call)))
        self._run_together(together, results)
        return [self._answer(*items[i]) if r is None else r for i, r in enumerate(results)]  # no kit to spare: alone

    def _answer(self, source: KernelSource, call: NamedCall) -> NamedOutputs | KemError:
        try:
            return self.run(source, call)
        except KemError as exc:
            return exc

    def _answer_plan(self, plan: NamedPlan, call: NamedCall) -> NamedOutputs | KemError:
        try:
            result, words = self._dispatch(plan, plan.datas(call), plan.shape[:3])
            return named_gas.outputs(result, words, plan.slot, plan.invocations)
        except KemError as exc:
            return exc

    def _run_together(self, together: list, results: list) -> None:
        self._kits.held.clear()  # planned: a GPU error below drops these kits too, and the next kit made trims to KITS
        if not together:
            return
        runs = [(kit, plan.pipeline, plan.bound, datas, plan.groups, plan.cap) for _, plan, kit, datas in together]
        try:
            staging = self._kits.batch_staging(self._device, staging_bytes(runs))
            outs = run_together(self.gpu.hot, runs, self.gpu.lone_spin_s, staging)
        except wgpu.GPUError as exc:
            error = KemError("gpu_error", gpu_message(exc))
            for i, plan, _, _ in together:
                self._kits.drop(plan.shape[:3])  # their state is unknown
                results[i] = error
            return
        for (i, plan, _, _), (result, words) in zip(together, outs):
            try:
                results[i] = named_gas.outputs(result, words, plan.slot, plan.invocations)
            except KemError as exc:  # gas_exhausted: this call's, not its batch-mates'
                results[i] = exc
        self.stats.bump((("named_calls", len(together)), ("named_batches", 1),
                         ("bytes_out", sum(len(b) for r in outs for b in r[0].values()))))

    def _plan_of(self, source: KernelSource, call: NamedCall) -> NamedPlan:
        device = self.gpu.require()
        if device is not self._device:  # a new device: the old one's pipelines, kits and plans go
            self._pipelines.clear()
            self._kits.clear()
            self._plans.clear()
            self._device = device
        key = signature(source.sha256, call)
        plan = self._plans.get(key)
        if plan is None or not plan.kit.live:
            return self._plan(device, source, call, key)
        self._plans.move_to_end(key)
        self.stats.inc("pipeline_hits")
        return plan

    def _plan(self, device: wgpu.GPUDevice, source: KernelSource, call: NamedCall, key: tuple) -> NamedPlan:
        """Every check of a call of this signature, and what it runs on
        (named_plan.py); kept when its kit is (a large shape's is not)."""
        shape = self._shape(source)
        entry = shape.entry_points.get(call.entry_point)
        if entry is None or entry.stage != "compute":
            raise KemError("bad_kernel", f"no @compute entry point {call.entry_point!r} (found {shape.compute_entries()})")
        if call.workgroups is None and call.grid is None:
            raise bad_args(NEEDS_DISPATCH)
        entry = resolve_entry(entry, shape, call.constants)  # an override may size the workgroup
        check_workgroup_limits(entry, device.limits, source.text, shape, call.constants)
        limits = Limits(self.gpu.binding_limit, self.gpu.uniform_limit)
        bound = plan_bindings(shape, call, limits, self._used(source, call.entry_point))
        check_sizes(bound)
        returned = sum(x.logical for x in bound if x.returned)  # outputs and in/out buffers
        if returned > self.gpu.config.max_output_bytes:
            raise too_large(f"{returned} bytes would come back; KEM_MAX_OUTPUT_BYTES={self.gpu.config.max_output_bytes}")
        groups = plan_dispatch(entry, 0, (), call.workgroups, self.gpu.dispatch_limits, call.grid)
        # The caller's dispatch, bounded as a chain step's is (chain_budget.py):
        # each dimension alone within the device's limit is not a bound on work.
        ChainBudget(self.gpu.config.max_output_bytes).add_dispatch(entry, groups)
        pipeline, layouts, gas_group = self._pipelines.get(device, source, call.entry_point, _set(call), bound,
                                                           pipeline_constants(shape, call.constants), limits)
        # A looping kernel's budget, spread over its invocations as on the
        # execute road: gas_exhausted before launch when it cannot cover them.
        slot = None if gas_group is None else gas_meter.slot_for(call.gas_limit or self.gpu.config.gas_limit, entry, groups, self.gpu.gas_turns)
        if slot is None and call.gas_limit is not None:  # loop-free: its gas is what it launches (as execute's)
            gas_meter.per_invocation_cap(call.gas_limit, gas_meter.invocations(entry, groups), self.gpu.gas_turns)
        shape = (source.sha256, call.entry_point, _set(call)) + tuple((x.binding.group, x.binding.binding, x.role, x.size) for x in bound)
        kit = self._kits.get(device, layouts, bound, shape, gas_group)
        plan = NamedPlan(pipeline, kit, bound, given_keys(bound, call), groups, slot, gas_meter.invocations(entry, groups),
                         layouts, gas_group, shape)
        if kit.bytes <= KIT_BYTES:
            self._plans[key] = plan
            while len(self._plans) > PLANS:
                self._plans.popitem(last=False)
        return plan

    def check_constants(self, source: KernelSource, constants: tuple | None) -> None:
        """bad_args naming an unknown or missing override: checked before
        admission, whose worker compile would fail on them as bad_kernel
        without naming them (the port's run_methods, api_named, kem check)."""
        resolve_entry(None, self._shape(source), constants)

    def small(self, source: KernelSource, call: NamedCall) -> bool:
        """Whether the call is as short as a lone kem@1.0 call the reader
        runs itself (port/lone_call.py): at most SMALL_INVOCATIONS, the
        invocations kem's own rule gives a 64 KiB output, its bytes within
        64 KiB, and a kernel that cannot loop (WGSL has no recursion, so its
        time is bounded by its invocations; gpu/wgsl/wgsl_calls.py)."""
        shape = self._shape(source)
        entry = shape.entry_points.get(call.entry_point)
        try:
            entry = resolve_entry(entry, shape, call.constants)
        except KemError:
            return False  # refused on the road that answers it
        if entry is None or entry.workgroup_size is None or call.batch_bytes > SMALL_BYTES:
            return False
        size = entry.workgroup_size[0] * entry.workgroup_size[1] * entry.workgroup_size[2]
        if call.grid is not None:
            groups = [-(-g // w) for g, w in zip(call.grid, entry.workgroup_size)]
        else:
            groups = list(call.workgroups or (0, 0, 0))
        invocations = groups[0] * groups[1] * groups[2] * size
        return 0 < invocations <= SMALL_INVOCATIONS and not may_loop(source.text, source.sha256, call.entry_point)

    def compile(self, source: KernelSource, call: NamedCall) -> None:
        """Compile the pipeline a call of this shape runs, without running it (kem check)."""
        shape = self._shape(source)
        entry = shape.entry_points.get(call.entry_point)
        if entry is not None:  # built here too, and kem check said ok where run refuses (red team 9)
            check_workgroup_limits(resolve_entry(entry, shape, call.constants), self.gpu.require().limits, source.text,
                                   shape, call.constants)
        limits = Limits(self.gpu.binding_limit, self.gpu.uniform_limit)
        bound = plan_bindings(shape, call, limits, self._used(source, call.entry_point))
        self._pipelines.get(self.gpu.require(), source, call.entry_point, _set(call), bound,
                            pipeline_constants(shape, call.constants), limits)

    def _used(self, source: KernelSource, entry: str) -> set[str] | None:
        """The names entry's code reaches (wgsl_calls.used_names), once per kernel and entry point."""
        return self._uses.get((source.sha256, entry), lambda: used_names(source.text, entry))

    def _shape(self, source: KernelSource) -> KernelShape:
        # The kernel's own bindings, whether the text is as written or its admitted gas form.
        return self._shapes.get(source.sha256, lambda: named_gas.kernel_shape(reflect(source.text)), len(source.text))

    def _dispatch(self, plan: NamedPlan, datas: list[bytes | None], key: tuple) -> tuple[dict[str, bytes], tuple | None]:
        kit = plan.kit
        try:  # wgpu-native's errors are captured and raised inside (named_kit.py)
            result, words = kit.run(self.gpu.hot, plan.pipeline, plan.bound, datas, plan.groups, self.gpu.lone_spin_s, plan.cap)
        except wgpu.GPUError as exc:
            self._kits.drop(key)  # its state is unknown
            raise KemError("gpu_error", gpu_message(exc)) from None
        if kit.bytes > KIT_BYTES:
            kit.release()  # a large shape is not kept: at most KITS x KIT_BYTES of buffers stay
        self.stats.bump((("named_calls", 1), ("bytes_out", sum(map(len, result.values())))))
        return result, words

def _set(call: NamedCall) -> tuple | None:
    """A call's constants set as a key (gpu/constants.set_key: -0.0 is not 0.0)."""
    return set_key(call.constants) if call.constants else None
