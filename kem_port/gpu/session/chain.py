"""Running a validated chain (gpu/session/chain_plan.py) as ONE submission.

Temporaries come from the buffer pool and are cleared (or filled with the
bytes they start with); every kernel step is one dispatch, consecutive
ones in one compute pass (WebGPU orders dispatches that share a buffer,
so step n+1 reads what step n wrote without a round trip); a copy or
clear step ends the pass and runs as the encoder's own copy command;
only the buffers asked for are copied to one staging buffer and read
back. A session call is a chain of one step. A looping step binds the
chain's cap and its own meter (chain_gas.py), read back in the same
submission; the result carries the chain's gas.
"""

from __future__ import annotations

from dataclasses import dataclass

import wgpu

from kem_port.gpu import contract
from kem_port.gpu.session.chain_gas import ChainGas, plan_gas
from kem_port.gpu.session.chain_plan import Chain, ChainPlan, Planner
from kem_port.gpu.session.chain_steps import PlannedClear, PlannedCopy, PlannedStep, Slot
from kem_port.gpu.device import Device
from kem_port.gpu.session.session_pipelines import SessionPipelines
from kem_port.gpu.session.sessions import finish_and_read
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.stats import Stats


@dataclass(frozen=True)
class ChainResult:
    """What a chain answers, and the gas it used (docs/metering.md): the
    figure a usage record carries for a session call or chain."""

    value: bytes | dict[str, bytes]
    gas: int


class ChainRunner:
    def __init__(self, gpu: Device, stats: Stats, max_temp_bytes: int, request_bytes: int, gas_limit: int) -> None:
        self.gpu = gpu
        self.stats = stats
        self.pipelines = SessionPipelines(stats)
        self.max_temp_bytes = max_temp_bytes
        self.request_bytes = request_bytes
        self.gas_limit = gas_limit  # the node's KEM_GAS_LIMIT: a chain's budget when it gives none

    def plan(self, chain: Chain) -> ChainPlan:
        return Planner(chain, self.gpu, self.pipelines, self.max_temp_bytes, self.request_bytes).plan()

    def run(self, chain: Chain) -> ChainResult:
        """Validate every step, then encode, submit and read back once."""
        plan = self.plan(chain)
        gas = plan_gas(plan, chain.gas_limit, self.gas_limit, self.gpu.storage_align, self.gpu.gas_turns)
        results, meter = self._execute(plan, gas)
        self.stats.inc("chain_steps", len(plan.steps))
        used = gas.settle(meter)  # gas_exhausted, naming the step, once the chain has landed
        if not plan.named_result:
            return ChainResult(results[0], used)
        return ChainResult(dict(zip(plan.names, results)), used)

    def _execute(self, plan: ChainPlan, gas: ChainGas) -> tuple[list[bytes], bytes]:
        device = self.gpu.require()
        pool = self.gpu.pool
        assert pool is not None
        taken: list[tuple[str, wgpu.GPUBuffer]] = []
        try:
            self._take_temporaries(plan.temporaries, taken)
            u_buf = self._params(device, plan, taken, gas)
            encoder = device.create_command_encoder()
            self._fill_temporaries(device, encoder, plan.temporaries)
            meter_buf = None
            if gas.meter_bytes:  # zeroed in this submission, before the first dispatch
                meter_buf = pool.take("session", gas.meter_bytes)
                taken.append(("session", meter_buf))
                encoder.clear_buffer(meter_buf, 0, gas.meter_bytes)
            self._encode(device, encoder, plan, u_buf, gas, meter_buf)
            # A buffer the last step writes rides along as a fence: the
            # answer waits for the work even when nothing else is read.
            fence = plan.steps[-1].written
            ranges = [(slot.buffer, slot.offset, pad_copy(slot)) for slot in plan.returns]
            if not any(slot is fence and slot.logical for slot in plan.returns):
                ranges.append((fence.buffer, fence.offset, 4))
            if meter_buf is not None:
                ranges.append((meter_buf, 0, gas.meter_bytes))
            read = finish_and_read(device, self.gpu, encoder, ranges)
            meter = read[-1] if meter_buf is not None else b""
            return [data[: slot.logical] for data, slot in zip(read, plan.returns)], meter
        finally:
            for kind, buf in taken:
                pool.give(kind, buf)

    def _take_temporaries(self, temporaries: list[Slot], taken: list) -> None:
        """One pooled buffer per temporary: WebGPU tracks read and write use
        per buffer, not per range, so temporaries cannot share one."""
        for slot in temporaries:
            slot.buffer = self.gpu.pool.take("session", slot.size)  # type: ignore[union-attr]
            taken.append(("session", slot.buffer))

    def _encode(self, device: wgpu.GPUDevice, encoder, plan: ChainPlan, u_buf, gas: ChainGas, meter_buf) -> None:
        """Kernel steps in compute passes; a copy or clear between passes."""
        compute, current = None, None
        for index, step in enumerate(plan.steps):
            if type(step) is PlannedStep:
                if compute is None:
                    compute, current = encoder.begin_compute_pass(), None
                if step.pipeline is not current:
                    compute.set_pipeline(step.pipeline.pipeline)
                    current = step.pipeline
                metered = gas.bind_entries(index, u_buf, meter_buf) if step.pipeline.gas_group is not None else None
                for group, bind_group in self._bind_groups(device, step, u_buf, metered):
                    compute.set_bind_group(group, bind_group)
                compute.dispatch_workgroups(*step.groups)
                continue
            if compute is not None:
                compute.end()
                compute = None
            if type(step) is PlannedCopy:
                if step.size:
                    encoder.copy_buffer_to_buffer(step.src.buffer, step.src.offset + step.src_offset,
                                                  step.dst.buffer, step.dst.offset + step.dst_offset, step.size)
            elif type(step) is PlannedClear and step.size:
                encoder.clear_buffer(step.slot.buffer, step.slot.offset + step.offset, step.size)
        if compute is not None:
            compute.end()

    def _params(self, device: wgpu.GPUDevice, plan: ChainPlan, taken: list, gas: ChainGas) -> wgpu.GPUBuffer | None:
        """Every step's uniforms in one uniform buffer, each at an aligned
        offset, and the chain's gas cap after them when a step loops."""
        total = 0
        for step in plan.steps:
            if type(step) is PlannedStep:
                step.u_offsets = []
                for _, _, data in step.uniforms:
                    step.u_offsets.append(total)
                    total += contract.align(_uniform_size(data), self.gpu.uniform_align)
        if gas.meters:
            gas.cap_offset = total
            total += contract.align(wgsl_gas.CAP_BYTES, self.gpu.uniform_align)
        if not total:
            return None
        u_buf = self.gpu.pool.take("uniform", total)  # type: ignore[union-attr]
        taken.append(("uniform", u_buf))
        packed = bytearray(total)
        for step in plan.steps:
            if type(step) is PlannedStep:
                for (_, _, data), at in zip(step.uniforms, step.u_offsets):
                    packed[at : at + len(data)] = data
        if gas.meters:
            packed[gas.cap_offset : gas.cap_offset + 4] = gas.cap.to_bytes(4, "little")
        device.queue.write_buffer(u_buf, 0, packed)
        return u_buf

    @staticmethod
    def _fill_temporaries(device: wgpu.GPUDevice, encoder, temporaries: list[Slot]) -> None:
        """The chain's input is uploaded whole (zero-padded); every other
        temporary is cleared, since pooled buffers hold earlier bytes."""
        for slot in temporaries:
            if slot.upload is not None:
                data = bytes(slot.upload) + bytes(slot.size - len(slot.upload))
                device.queue.write_buffer(slot.buffer, 0, data)
            else:
                encoder.clear_buffer(slot.buffer, 0, slot.size)

    def _bind_groups(self, device: wgpu.GPUDevice, step: PlannedStep, u_buf,
                     metered: list[dict] | None) -> list[tuple[int, wgpu.GPUBindGroup]]:
        """The step's bind group of each group its layout has (the gas
        group's: `metered`), cached by their buffers."""
        entries: dict[int, list[dict]] = {group: [] for group in step.pipeline.layouts}
        if metered is not None:
            entries[step.pipeline.gas_group] = metered  # type: ignore[index]
        for group, binding, slot in step.storage:
            entries[group].append(_entry(binding, slot.buffer, slot.offset, slot.size))
        for (group, binding, data), at in zip(step.uniforms, step.u_offsets):
            entries[group].append(_entry(binding, u_buf, at, _uniform_size(data)))
        return [(group, self.pipelines.bind_group(device, step.pipeline, found, group)) for group, found in entries.items()]


def _entry(binding: int, buffer: wgpu.GPUBuffer, offset: int, size: int) -> dict:
    return {"binding": binding, "resource": {"buffer": buffer, "offset": offset, "size": size}}


def _uniform_size(params: bytes) -> int:
    return max(contract.align(len(params), contract.UNIFORM_ALIGN), contract.MIN_UNIFORM_BYTES)


def pad_copy(slot: Slot) -> int:
    """Bytes to copy back: whole words covering what the caller sees."""
    return contract.pad4(slot.logical)
