"""Gas of a chain or session call (docs/metering.md, "Sessions and chains").

A chain is one request with one gas limit (its ``gas_limit`` option, else
the node's KEM_GAS_LIMIT), as its bytes and work are one request's
(chain_budget.py). Its gas is the sum over its kernel steps of invocations
launched plus loop iterations counted; copy and clear steps launch no
invocation and count 0.

Caps are fixed before the one submission (the GPU cannot move budget
between dispatches), so the limit is split by the execute road's rule
over the whole chain: every step's invocations are paid first, and what
is left is shared evenly by every invocation of the looping steps,

    cap = min((limit - invocations of all steps) // invocations of looping steps, 2^30)

one cap for every looping step (16 bytes after the steps' uniforms). A
session call is a chain of one step, so its cap is exactly an execute
call's. Rejected: the limit divided by the steps (a one-workgroup step
beside a million-invocation one got the same share as it, per invocation
a million times more), and each step its own full limit with the total
checked after (a chain of n runaways ran n times its limit before anyone
noticed). Every successful chain used at most its limit.

Each looping step has its own 16-byte meter, a slot of one pooled buffer
(slots ``min-storage-buffer-offset-alignment`` apart), cleared at the
start of the submission and read back with the chain's results in the
same submission. The first step whose meter says it ran out fails the
chain with ``gas_exhausted`` naming it. The submission ran whole: the
steps after it ran too, on what it left, and the session's buffers stay as
the chain left them (a GPU cannot roll back one submission).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kem_port.errors import KemError
from kem_port.gpu import gas_meter
from kem_port.gpu.contract import align
from kem_port.gpu.session.chain_steps import ChainPlan, PlannedStep, StepError
from kem_port.gpu.wgsl import wgsl_gas


@dataclass
class ChainGas:
    """Where a chain's cap and meters are, and what it launches."""

    limit: int
    cap: int  # loop iterations each invocation of a looping step may count
    launched: list[tuple[int, int]]  # (step index, invocations) of every kernel step
    meters: dict[int, int] = field(default_factory=dict)  # step index -> its slot's offset in the meter buffer
    meter_bytes: int = 0
    cap_offset: int = 0  # in the chain's uniform buffer (ChainRunner._params sets it)

    def bind_entries(self, index: int, u_buf, meter_buf) -> list[dict]:
        """The gas group's entries for step index: the cap, then its meter."""
        return [
            {"binding": wgsl_gas.CAP_BINDING, "resource": {"buffer": u_buf, "offset": self.cap_offset, "size": wgsl_gas.CAP_BYTES}},
            {"binding": wgsl_gas.METER_BINDING,
             "resource": {"buffer": meter_buf, "offset": self.meters[index], "size": wgsl_gas.METER_BYTES}},
        ]

    def settle(self, meter: bytes) -> int:
        """The chain's gas from the meters read back; StepError
        gas_exhausted naming the first step that ran out."""
        total, first = 0, None
        for index, launched in self.launched:
            at = self.meters.get(index)
            if at is None:
                total += launched
                continue
            gas, ran_out = gas_meter.meter_gas(memoryview(meter)[at : at + wgsl_gas.METER_BYTES].cast("I"), launched)
            total += gas
            first = index if ran_out and first is None else first
        if first is not None:
            raise StepError(first, KemError("gas_exhausted", f"gas used {total} of limit {self.limit} "
                                                             f"(an invocation passed its {self.cap} loop iterations)"))
        return total


def plan_gas(plan: ChainPlan, limit: int | None, default_limit: int, storage_align: int, turns: int) -> ChainGas:
    """The chain's cap and a meter slot per looping step; gas_exhausted,
    naming the step whose launch passes it, when the limit does not cover
    launching every step. As an execute call's: a loop-free chain is
    checked against its own limit only (`limit`; None: the node's
    default_limit, which bounds loops: launches are bounded by chain_budget.py)."""
    launched, looping = [], []
    for index, step in enumerate(plan.steps):
        if type(step) is PlannedStep:
            count = gas_meter.invocations(step.pipeline.shape.entry, step.groups)
            launched.append((index, count))
            if step.pipeline.gas_group is not None:
                looping.append((index, count))
    gas = ChainGas(limit or default_limit, turns, launched)
    if not looping and limit is None:
        return gas
    everything = sum(count for _, count in launched)
    if gas.limit < everything:
        _refuse_launch(launched, gas.limit, everything)
    looping_invocations = sum(count for _, count in looping)
    if looping_invocations:
        gas.cap = min((gas.limit - everything) // looping_invocations, turns)
    stride = align(wgsl_gas.METER_BYTES, storage_align)
    gas.meters = {index: k * stride for k, (index, _) in enumerate(looping)}
    gas.meter_bytes = stride * len(looping)
    return gas


def _refuse_launch(launched: list[tuple[int, int]], limit: int, everything: int) -> None:
    """gas_exhausted before anything runs, naming the step whose launch passes the limit."""
    running = 0
    for index, count in launched:
        running += count
        if running > limit:
            raise StepError(index, KemError("gas_exhausted", f"gas used 0 of limit {limit}: launching the chain's steps "
                                                             f"up to this one needs {running} (all of them {everything})"))
