"""A call by named buffers, run in one submission on the GPU thread.

The kernel's pipeline is compiled once per (kernel sha256, entry point)
with an explicit layout read off its declarations (one bind group layout
per group it uses, each binding typed by its role: read-only storage,
storage, uniform), so the device enforces the WGSL's access modes. A call
runs on its shape's kit (named_kit.py: buffers and bind groups reused,
every buffer overwritten or cleared each call, so a call never sees
another's bytes); one encoder runs the dispatch and copies every returned
buffer into one staging buffer, read after one wait.

A road beside the executor's batch road, through the same native calls
(gpu/hot_path.py): the batch road's plans bind kem@1.0's layout (bindings
0-3 of group 0, packed per batch), a named call any layout in up to four
groups. No figure pays for it: it is the capability, not a speed-up, and
it costs 2x a kem@1.0 call moving the same bytes (docs/benchmarks.md,
"Issue 25"); folding named calls into the batch road's plans, so they
batch into one submission, is issue 25's open item.
"""

from __future__ import annotations

from collections import OrderedDict

import wgpu

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.device import Device
from kem_port.gpu import gas_meter
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.named.binding_model import NEEDS_DISPATCH, Bound, Limits, NamedCall, check_sizes, plan_bindings
from kem_port.gpu.named import named_gas
from kem_port.gpu.named.named_gas import NamedOutputs
from kem_port.gpu.named.named_kit import NamedKit
from kem_port.gpu.named.named_plan import PLANS, NamedPlan, given_keys, signature
from kem_port.gpu.constants import check_workgroup_limits, pipeline_constants, resolve_entry, set_key
from kem_port.gpu.pipelines import compute_stage, gpu_message, named_shader
from kem_port.gpu.wgsl.wgsl_calls import may_loop, used_names
from kem_port.gpu.session.chain_budget import ChainBudget
from kem_port.gpu.wgpu_private import ErrorCapture
from kem_port.gpu.wgsl.wgsl_reflect import KernelShape, reflect
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats

PIPELINES = 64  # kernels kept compiled (a pipeline and its layouts: ~KBs of host memory each)
KITS = 16  # call shapes kept with their buffers (named_kit.py)
SMALL_BYTES = 64 << 10  # a lone kem@1.0 call's bytes (port/gpu_loop.SMALL_CALL)
SMALL_INVOCATIONS = SMALL_BYTES // 4  # what kem's 1-D rule dispatches for a 64 KiB output
KIT_BYTES = 4 << 20  # a shape's buffers up to this are kept: at most 64 MiB in all
_TYPES = {"input": "read-only-storage", "output": "storage", "inout": "storage", "uniform": "uniform"}


class NamedRuns:
    """Named-buffer calls on one executor's device."""

    def __init__(self, gpu: Device, stats: Stats) -> None:
        self.gpu, self.stats = gpu, stats
        self._device: wgpu.GPUDevice | None = None
        self._pipelines: OrderedDict[tuple, tuple] = OrderedDict()
        self._shapes: dict[str, KernelShape] = {}
        self._kits: OrderedDict[tuple, NamedKit] = OrderedDict()  # per call shape (named_kit.py)
        self._plans: OrderedDict[tuple, NamedPlan] = OrderedDict()  # per call signature (named_plan.py)
        self._uses: dict[tuple, set[str] | None] = {}  # per (kernel, entry point): the names its code reaches

    def run(self, source: KernelSource, call: NamedCall) -> NamedOutputs:
        """The call's returned buffers by WGSL name, with its gas (.gas).
        Raises KemError (gas_exhausted: a looping kernel passed its budget)."""
        device = self.gpu.require()
        if device is not self._device:  # a new device: the old one's pipelines, kits and plans go
            self._pipelines.clear()
            self._kits.clear()
            self._plans.clear()
            self._device = device
        key = signature(source.sha256, call)
        plan = self._plans.get(key)
        if plan is None or not plan.kit.live:
            plan = self._plan(device, source, call, key)
        else:
            self._plans.move_to_end(key)
            self.stats.inc("pipeline_hits")
        result, words = self._dispatch(plan, plan.datas(call), (source.sha256, call.entry_point, _set(call)))
        return named_gas.outputs(result, words, plan.slot, plan.invocations)

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
        check_workgroup_limits(entry, device.limits)
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
        pipeline, layouts, gas_group = self._pipeline(device, source, call, bound, pipeline_constants(shape, call.constants), limits)
        # A looping kernel's budget, spread over its invocations as on the
        # execute road: gas_exhausted before launch when it cannot cover them.
        slot = None if gas_group is None else gas_meter.slot_for(call.gas_limit or self.gpu.config.gas_limit, entry, groups, self.gpu.gas_turns)
        if slot is None and call.gas_limit is not None:  # loop-free: its gas is what it launches (as execute's)
            gas_meter.per_invocation_cap(call.gas_limit, gas_meter.invocations(entry, groups), self.gpu.gas_turns)
        kit = self._kit(device, layouts, bound, (source.sha256, call.entry_point, _set(call)), gas_group)
        plan = NamedPlan(pipeline, kit, bound, given_keys(bound, call), groups, slot, gas_meter.invocations(entry, groups))
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
        limits = Limits(self.gpu.binding_limit, self.gpu.uniform_limit)
        bound = plan_bindings(shape, call, limits, self._used(source, call.entry_point))
        self._pipeline(self.gpu.require(), source, call, bound, pipeline_constants(shape, call.constants), limits)

    def _used(self, source: KernelSource, entry: str) -> set[str] | None:
        """The names entry's code reaches (wgsl_calls.used_names), once per kernel and entry point."""
        key = (source.sha256, entry)
        if key not in self._uses:
            self._uses[key] = used_names(source.text, entry)
            while len(self._uses) > PIPELINES:
                self._uses.pop(next(iter(self._uses)))
        return self._uses[key]

    def _shape(self, source: KernelSource) -> KernelShape:
        shape = self._shapes.get(source.sha256)
        if shape is None:
            # The kernel's own bindings, whether the text is as written or its admitted gas form.
            shape = self._shapes[source.sha256] = named_gas.kernel_shape(reflect(source.text))
            while len(self._shapes) > PIPELINES:  # kept as long as pipelines are: bounded memory
                self._shapes.pop(next(iter(self._shapes)))
        return shape

    def _pipeline(self, device: wgpu.GPUDevice, source: KernelSource, call: NamedCall, bound: list[Bound],
                  constants: dict[str, float], limits: Limits) -> tuple:
        """(pipeline, layouts, the gas meter's group or None) of the kernel's gas form, compiled once per key."""
        entry = call.entry_point
        key = (source.sha256, entry, _set(call))  # each constants set is its own pipeline
        found = self._pipelines.get(key)
        if found is not None:
            self._pipelines.move_to_end(key)
            self.stats.inc("pipeline_hits")
            return found
        text, gas_group = named_gas.gas_text(source)  # every loop counted (gpu/wgsl/wgsl_gas.py)
        if gas_group is not None:
            named_gas.check_room(bound, limits)
        errors = ErrorCapture()
        try:
            module = errors.call(lambda: device.create_shader_module(code=text, label=source.kernel_id))
        except wgpu.GPUError as exc:
            raise KemError("shader_error", named_shader(gpu_message(exc), source.kernel_id)) from None
        try:
            layouts = errors.call(self._layouts, device, bound, gas_group)
            pipeline = errors.call(lambda: device.create_compute_pipeline(
                layout=device.create_pipeline_layout(bind_group_layouts=list(layouts.values())),
                compute=compute_stage(module, entry, constants)))
        except wgpu.GPUError as exc:
            raise KemError("bad_kernel", gpu_message(exc)) from None
        self.stats.inc("compiles")
        self._pipelines[key] = found = (pipeline, layouts, gas_group)
        while len(self._pipelines) > PIPELINES:
            self._pipelines.popitem(last=False)
        return found

    @staticmethod
    def _layouts(device: wgpu.GPUDevice, bound: list[Bound], gas_group: int | None) -> dict[int, wgpu.GPUBindGroupLayout]:
        """One layout per group 0..the highest used, the gas group's holding
        the cap and meter (an unused group gets an empty one, as WebGPU requires)."""
        top = max([x.binding.group for x in bound] + ([gas_group] if gas_group is not None else []))
        return {
            group: device.create_bind_group_layout(entries=gas_meter.layout_entries() if group == gas_group else [
                {"binding": x.binding.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": _TYPES[x.role]}}
                for x in bound if x.binding.group == group
            ])
            for group in range(top + 1)
        }

    def _dispatch(self, plan: NamedPlan, datas: list[bytes | None], key: tuple) -> tuple[dict[str, bytes], tuple | None]:
        kit = plan.kit
        try:  # wgpu-native's errors are captured and raised inside (named_kit.py)
            result, words = kit.run(self.gpu.hot, plan.pipeline, plan.bound, datas, plan.groups,
                                    self.gpu.lone_spin_s, plan.slot.cap if plan.slot else 0)
        except wgpu.GPUError as exc:
            self._drop(key)  # its state is unknown
            raise KemError("gpu_error", gpu_message(exc)) from None
        if kit.bytes > KIT_BYTES:
            kit.release()  # a large shape is not kept: at most KITS x KIT_BYTES of buffers stay
        self.stats.bump((("named_calls", 1), ("bytes_out", sum(map(len, result.values())))))
        return result, words

    def _kit(self, device: wgpu.GPUDevice, layouts: dict, bound: list[Bound], key: tuple, gas_group: int | None) -> NamedKit:
        shape = key + tuple((x.binding.group, x.binding.binding, x.role, x.size) for x in bound)
        kit = self._kits.get(shape)
        if kit is not None:
            self._kits.move_to_end(shape)
            return kit
        kit = NamedKit(device, layouts, bound, gas_group)
        if kit.bytes <= KIT_BYTES:
            self._kits[shape] = kit
            while len(self._kits) > KITS:
                self._kits.popitem(last=False)[1].release()
        return kit

    def _drop(self, key: tuple) -> None:
        for shape in [s for s in self._kits if s[: len(key)] == key]:
            self._kits.pop(shape).release()


def _set(call: NamedCall) -> tuple | None:
    """A call's constants set as a key (gpu/constants.set_key: -0.0 is not 0.0)."""
    return set_key(call.constants) if call.constants else None
