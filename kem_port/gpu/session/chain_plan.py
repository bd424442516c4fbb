"""A chain of kernel steps, validated whole before anything is submitted.

Which buffer feeds which binding of each step (docs/sessions.md):

* binding 0 (input): the buffer named by the step's ``input``; else the
  previous step's output; for the first step, the chain's input bytes.
* binding 1 (output): the buffer named by ``output`` (a session buffer is
  written in place; any other name becomes a temporary that later steps
  can name); else an unnamed temporary. A new temporary has
  ``output_size`` bytes, by default the size of the step's input.
* bindings 3 and up: the buffer named like the WGSL variable, or as the
  step's ``bind`` map renames it (``#{WgslName => BufferName}``).

Every step's kernel, layout, buffers, sizes, access conflicts and dispatch
are checked here; a failure names the step (:class:`StepError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import wgpu

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.session.chain_budget import ChainBudget
from kem_port.gpu.contract import pad4
from kem_port.gpu.device import Device
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.session.session_pipelines import SessionPipeline, SessionPipelines
from kem_port.gpu.session.sessions import Session, quota_exceeded
from kem_port.kernel_store import KernelSource


@dataclass(frozen=True)
class Step:
    source: KernelSource
    params: bytes | None = None
    workgroups: tuple[int, int, int] | None = None
    entry_point: str = "main"
    bind: dict[str, str] = field(default_factory=dict)
    input: str | None = None
    output: str | None = None
    output_size: int | None = None
    grid: tuple[int, int, int] | None = None  # invocations, divided by the workgroup size (gpu/dispatch.py)

    @property
    def param_words(self) -> tuple[int, ...]:
        data = self.params or b""
        return tuple(int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data) // 4 * 4, 4))


@dataclass(frozen=True)
class Chain:
    steps: tuple[Step, ...]
    input: bytes | memoryview = b""
    returns: tuple[str, ...] | None = None  # None: the last step's output, as bytes
    session: Session | None = None


class StepError(KemError):
    """A KemError that belongs to one step of a chain (0-based index)."""

    def __init__(self, step: int, error: KemError) -> None:
        super().__init__(error.reason, error.detail)
        self.step = step


@dataclass(eq=False)
class Slot:
    """A buffer a chain binds: a session buffer, or a temporary."""

    name: str | None
    logical: int  # the bytes a caller sees
    buffer: wgpu.GPUBuffer | None = None  # a session buffer, or the temporary once taken
    temporary: bool = True
    offset: int = 0  # where the bytes start in `buffer`
    upload: bytes | memoryview | None = None  # the chain's input bytes

    @property
    def size(self) -> int:
        return max(pad4(self.logical), 4)  # what is bound and allocated


@dataclass
class PlannedStep:
    pipeline: SessionPipeline
    groups: tuple[int, int, int]
    input: Slot
    output: Slot
    named: list[tuple[int, Slot]]
    params: bytes | None
    u_offset: int = 0


@dataclass
class ChainPlan:
    steps: list[PlannedStep]
    temporaries: list[Slot]
    returns: list[Slot]
    named_result: bool


class Planner:
    def __init__(self, chain: Chain, gpu: Device, pipelines: SessionPipelines, max_temp_bytes: int, request_bytes: int) -> None:
        self.chain = chain
        self.gpu = gpu
        self.pipelines = pipelines
        self.max_temp_bytes = max_temp_bytes
        self.budget = ChainBudget(request_bytes)  # one request's bytes and work (gpu/chain_budget.py)
        self.slots: dict[str, Slot] = {}
        self.temporaries: list[Slot] = []

    def plan(self) -> ChainPlan:
        if not self.chain.steps:
            raise bad_args("a chain needs at least one step")
        previous = self._temporary(None, len(self.chain.input))
        previous.upload = self.chain.input
        steps = []
        for index, step in enumerate(self.chain.steps):
            try:
                steps.append(self._step(step, previous))
            except KemError as exc:
                raise StepError(index, exc) from None
            previous = steps[-1].output
        returns = [self._lookup(name) for name in self.chain.returns] if self.chain.returns is not None else [previous]
        for slot in returns:
            if not slot.temporary:  # a session buffer read back: staging the chain allocates
                self.budget.add_bytes(slot.size, f"returned buffer {slot.name!r}")
        temp_bytes = sum(s.size for s in self.temporaries)
        if temp_bytes > self.max_temp_bytes:
            raise quota_exceeded(f"the chain's temporaries need {temp_bytes} bytes, over the quota of {self.max_temp_bytes}")
        return ChainPlan(steps, self.temporaries, returns, self.chain.returns is not None)

    def _step(self, step: Step, previous: Slot) -> PlannedStep:
        compiled = self.pipelines.get(self.gpu.require(), step.source, step.entry_point, step.params)
        layout = compiled.shape
        source = self._lookup(step.input) if step.input is not None else previous
        output = self._output(step, source)
        known = {n.wgsl_name for n in layout.named}
        unknown = sorted(set(step.bind) - known)
        if unknown:
            raise bad_args(f"bind names {', '.join(unknown)}, which the kernel does not declare at @binding(3) or above")
        named = [(n.binding, self._lookup(step.bind.get(n.wgsl_name, n.wgsl_name))) for n in layout.named]
        uses = [(source, layout.input_writable), (output, True)] + [(slot, n.writable) for (_, slot), n in zip(named, layout.named)]
        _check_conflicts(uses)
        _check_whole_words([source] + [slot for _, slot in named])
        for slot, _ in uses:
            if slot.size > self.gpu.binding_limit:
                raise too_large(f"buffer of {slot.size} bytes is over this adapter's storage binding limit of {self.gpu.binding_limit}")
        if step.params is not None and len(step.params) > self.gpu.uniform_limit:
            raise too_large(f"params of {len(step.params)} bytes exceed the uniform limit {self.gpu.uniform_limit}")
        groups = plan_dispatch(layout.entry, _dispatch_bytes(step, output, named, layout), step.param_words, step.workgroups, self.gpu.dispatch_limits, step.grid)
        self.budget.add_dispatch(layout.entry, groups)
        return PlannedStep(compiled, groups, source, output, named, step.params)

    def _output(self, step: Step, source: Slot) -> Slot:
        if step.output is not None and step.output in self._known_names():
            slot = self._lookup(step.output)
            if step.output_size is not None and step.output_size != slot.logical:
                raise bad_args(f"output_size {step.output_size} differs from buffer {step.output!r} of {slot.logical} bytes")
            return slot
        size = step.output_size if step.output_size is not None else source.logical
        self.budget.add_bytes(max(pad4(size), 4), "this step's output" if step.output is None else f"output {step.output!r}")
        slot = self._temporary(step.output, size)
        if step.output is not None:
            self.slots[step.output] = slot
        return slot

    def _known_names(self) -> set[str]:
        names = set(self.slots)
        if self.chain.session is not None:
            names |= set(self.chain.session.buffers)
        return names

    def _temporary(self, name: str | None, size: int) -> Slot:
        slot = Slot(name, size)
        self.temporaries.append(slot)
        return slot

    def _lookup(self, name: str) -> Slot:
        slot = self.slots.get(name)
        if slot is not None:
            return slot
        session = self.chain.session
        if session is not None and name in session.buffers:
            held = session.buffers[name]
            slot = self.slots[name] = Slot(name, held.size, held.buffer, temporary=False)
            return slot
        where = "in the session or made by an earlier step" if session is not None else "made by an earlier step"
        raise KemError("no_buffer", f"no buffer {name!r} {where}")


def _check_conflicts(uses: list[tuple[Slot, bool]]) -> None:
    """WebGPU refuses a buffer bound twice in one dispatch when either binding writes it."""
    for i, (slot, writes) in enumerate(uses):
        for other, other_writes in uses[i + 1 :]:
            if slot is other and (writes or other_writes):
                shown = slot.name or "the previous step's output"
                raise bad_args(f"buffer {shown!r} is bound twice in one step and written through one binding")


def _check_whole_words(read: list[Slot]) -> None:
    """A step reads an earlier step's output in whole words: a call would cut
    an odd-sized output and zero-pad it again, a chain cannot (the bytes
    past its end stay as the kernel wrote them), so it refuses instead."""
    for slot in read:
        if slot.temporary and slot.upload is None and slot.logical % 4:
            shown = repr(slot.name) if slot.name else "the previous step's output"
            raise bad_args(f"{shown} has {slot.logical} bytes; an output a later step reads must be a multiple of 4 (set output_size)")


def _dispatch_bytes(step: Step, output: Slot, named: list[tuple[int, Slot]], layout) -> int:
    """What the default dispatch counts: the output's bytes, else the first
    writable named buffer's (a state update that returns nothing)."""
    if output.logical > 0 or step.workgroups is not None or step.grid is not None:
        return output.logical
    for (_, slot), n in zip(named, layout.named):
        if n.writable:
            return slot.logical
    raise bad_args("nothing to size the dispatch by: no output and no writable named buffer; pass grid or workgroups")
