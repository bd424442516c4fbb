"""A chain of steps, validated whole before anything is submitted.

Which buffer feeds which binding of a kem@1.0-shaped kernel's step
(docs/sessions.md):

* binding 0 (input): the buffer named by the step's ``input``; else the
  previous kem@1.0-shaped step's output; for the first, the chain's input.
* binding 1 (output): the buffer named by ``output`` (a session buffer is
  written in place; any other name becomes a temporary that later steps
  can name); else an unnamed temporary. A new temporary has
  ``output_size`` bytes, by default the size of the step's input.
* binding 2: the step's ``params``.

Every other binding, and every binding of any other kernel, is named
(chain_bind.py). Copy and clear steps: chain_copy.py. Every step's kernel,
layout, buffers, sizes, access conflicts and dispatch are checked here; a
failure names the step (:class:`StepError`).
"""

from __future__ import annotations

from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.contract import pad4
from kem_port.gpu.device import Device
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.named.binding_model import NEEDS_DISPATCH, Limits
from kem_port.gpu.session.chain_bind import bind_named
from kem_port.gpu.session.chain_budget import ChainBudget
from kem_port.gpu.session.chain_copy import plan_clear, plan_copy
from kem_port.gpu.session.chain_steps import (  # noqa: F401 (Chain, Step, StepError: this module's public names)
    Chain, ChainPlan, ClearStep, CopyStep, PlannedStep, Slot, Step, StepError,
)
from kem_port.gpu.session.session_pipelines import SessionPipelines
from kem_port.gpu.session.sessions import quota_exceeded

POSITIONAL_ONLY = ("params", "input", "output", "output_size")


class Planner:
    def __init__(self, chain: Chain, gpu: Device, pipelines: SessionPipelines, max_temp_bytes: int, request_bytes: int) -> None:
        self.chain = chain
        self.gpu = gpu
        self.pipelines = pipelines
        self.max_temp_bytes = max_temp_bytes
        # One request's bytes and work (gpu/chain_budget.py): the port's, or the node's smaller budget.
        if chain.max_bytes is None or chain.max_bytes >= request_bytes:
            self.budget = ChainBudget(request_bytes)
        else:
            self.budget = ChainBudget(chain.max_bytes, "the node's request budget, request_max_output_bytes")
        self.slots: dict[str, Slot] = {}
        self.temporaries: list[Slot] = []
        self.limits = Limits(gpu.binding_limit, gpu.uniform_limit)

    def plan(self) -> ChainPlan:
        if not self.chain.steps:
            raise bad_args("a chain needs at least one step")
        previous = self.temporary(None, len(self.chain.input))
        previous.upload = self.chain.input
        steps: list = []
        last: PlannedStep | None = None
        for index, step in enumerate(self.chain.steps):
            try:
                steps.append(self._any(step, previous))
            except KemError as exc:
                raise StepError(index, exc) from None
            if isinstance(steps[-1], PlannedStep):
                last = steps[-1]
                previous = last.output or previous
        if len(self.chain.input) and not any(isinstance(s, PlannedStep) and s.output is not None
                                             and s.storage[0][2] is self.temporaries[0] for s in steps):
            raise bad_args("input bytes given, but no step reads them (binding 0 of a kem@1.0-shaped kernel does): "
                           "give a step's bytes in its buffers")
        names: list[str] = []
        if self.chain.returns is not None:
            names = list(self.chain.returns)
            returns = [self.lookup(name) for name in names]
        elif last is not None and last.output is None:  # a step that binds by name returns its buffers by name
            names, returns = list(last.results), list(last.results.values())
        else:
            returns = [previous]
        for slot in returns:
            if not slot.temporary:  # a session buffer read back: staging the chain allocates
                self.budget.add_bytes(slot.size, f"returned buffer {slot.name!r}")
        temp_bytes = sum(s.size for s in self.temporaries)
        if temp_bytes > self.max_temp_bytes:
            raise quota_exceeded(f"the chain's temporaries need {temp_bytes} bytes, over the quota of {self.max_temp_bytes}")
        named = self.chain.returns is not None or (last is not None and last.output is None)
        return ChainPlan(steps, self.temporaries, returns, named, names)

    def _any(self, step, previous: Slot):
        if isinstance(step, CopyStep):
            return plan_copy(step, self.lookup)
        if isinstance(step, ClearStep):
            return plan_clear(step, self.lookup)
        return self._step(step, previous)

    def _step(self, step: Step, previous: Slot) -> PlannedStep:
        device = self.gpu.require()
        compiled = self.pipelines.get(device, step.source, step.entry_point, step.params, step.constants)
        layout = compiled.shape  # its workgroup size checked against the device's limits once, when compiled
        storage, uniforms, uses, output = [], [], [], None
        if layout.positional:
            source = self.lookup(step.input) if step.input is not None else previous
            output = self._output(step, source)
            storage += [(0, 0, source), (0, 1, output)]
            uniforms += [(0, 2, step.params)] if step.params is not None else []
            uses += [(source, layout.input_writable), (output, True)]
            _check_whole_words([source])
        else:
            given = [k for k in POSITIONAL_ONLY if getattr(step, k) is not None]
            if given:
                raise bad_args(f"{', '.join(given)}: kem@1.0's bindings 0-2, which kernel {step.source.kernel_id!r} does not "
                               "have (it binds every buffer by name: buffers, outputs, bind)")
        named = bind_named(step, layout, self, self.limits)
        if named.storage or named.uniforms:
            storage += [(n.group, n.binding, slot) for n, slot in named.storage]
            uniforms += named.uniforms
            uses += [(slot, n.writable) for n, slot in named.storage]
            fresh = {id(slot) for slot in named.results.values()}  # made by this step, or its own bytes: nothing stale
            _check_whole_words([slot for _, slot in named.storage if id(slot) not in fresh])
        _check_conflicts(uses)
        for slot, _ in uses[:2] if layout.positional else ():
            if slot.size > self.gpu.binding_limit:
                raise too_large(f"buffer of {slot.size} bytes is over this adapter's storage binding limit of {self.gpu.binding_limit}")
        if step.params is not None and len(step.params) > self.gpu.uniform_limit:
            raise too_large(f"params of {len(step.params)} bytes exceed the uniform limit {self.gpu.uniform_limit}")
        written = output or next(slot for n, slot in named.storage if n.writable)
        if layout.positional:
            counted = _dispatch_bytes(step, output, named.storage)
        elif step.workgroups is None and step.grid is None:
            raise bad_args(NEEDS_DISPATCH)
        else:
            counted = 0
        groups = plan_dispatch(layout.entry, counted, step.param_words, step.workgroups, self.gpu.dispatch_limits, step.grid)
        self.budget.add_dispatch(layout.entry, groups)
        return PlannedStep(compiled, groups, storage, uniforms, output, named.results, written)

    def _output(self, step: Step, source: Slot) -> Slot:
        if step.output is not None and self.known(step.output):
            slot = self.lookup(step.output)
            if step.output_size is not None and step.output_size != slot.logical:
                raise bad_args(f"output_size {step.output_size} differs from buffer {step.output!r} of {slot.logical} bytes")
            return slot
        size = step.output_size if step.output_size is not None else source.logical
        self.budget.add_bytes(max(pad4(size), 4), "this step's output" if step.output is None else f"output {step.output!r}")
        return self.temporary(step.output, size)

    # -- the buffers a step can name (chain_bind.Buffers) --------------------

    def known(self, name: str) -> bool:
        session = self.chain.session
        return name in self.slots or (session is not None and name in session.buffers)

    def temporary(self, name: str | None, size: int) -> Slot:
        slot = Slot(name, size)
        self.temporaries.append(slot)
        if name is not None:
            self.slots[name] = slot
        return slot

    def lookup(self, name: str) -> Slot:
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


def _dispatch_bytes(step: Step, output: Slot, named: list) -> int:
    """What the default dispatch counts: the output's bytes, else the first
    writable named buffer's (a state update that returns nothing)."""
    if output.logical > 0 or step.workgroups is not None or step.grid is not None:
        return output.logical
    for n, slot in named:
        if n.writable:
            return slot.logical
    raise bad_args("nothing to size the dispatch by: no output and no writable named buffer; pass grid or workgroups")
