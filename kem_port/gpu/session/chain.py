"""Running a validated chain (gpu/chain_plan.py) as ONE submission.

Temporaries come from the buffer pool and are cleared; every step is one
dispatch of one compute pass (WebGPU orders dispatches that share a
buffer, so step n+1 reads what step n wrote without a round trip); only
the buffers asked for are copied to one staging buffer and read back.
A session call is a chain of one step whose input and output are the
call's own bytes.
"""

from __future__ import annotations

import wgpu

from kem_port.gpu import contract
from kem_port.gpu.session import session_contract
from kem_port.gpu.session.chain_plan import Chain, ChainPlan, Planner, Slot
from kem_port.gpu.device import Device
from kem_port.gpu.session.session_pipelines import SessionPipelines
from kem_port.gpu.session.sessions import finish_and_read
from kem_port.stats import Stats


class ChainRunner:
    def __init__(self, gpu: Device, stats: Stats, max_temp_bytes: int, request_bytes: int) -> None:
        self.gpu = gpu
        self.stats = stats
        self.pipelines = SessionPipelines(stats)
        self.max_temp_bytes = max_temp_bytes
        self.request_bytes = request_bytes

    def plan(self, chain: Chain) -> ChainPlan:
        return Planner(chain, self.gpu, self.pipelines, self.max_temp_bytes, self.request_bytes).plan()

    def run(self, chain: Chain) -> bytes | dict[str, bytes]:
        """Validate every step, then encode, submit and read back once."""
        plan = self.plan(chain)
        results = self._execute(plan)
        self.stats.inc("chain_steps", len(plan.steps))
        if not plan.named_result:
            return results[0]
        return {slot.name or "": data for slot, data in zip(plan.returns, results)}

    def _execute(self, plan: ChainPlan) -> list[bytes]:
        device = self.gpu.require()
        pool = self.gpu.pool
        assert pool is not None
        taken: list[tuple[str, wgpu.GPUBuffer]] = []
        try:
            self._take_temporaries(plan.temporaries, taken)
            u_buf = self._params(device, plan, taken)
            encoder = device.create_command_encoder()
            self._fill_temporaries(device, encoder, plan.temporaries)
            compute = encoder.begin_compute_pass()
            current = None
            for step in plan.steps:
                if step.pipeline is not current:
                    compute.set_pipeline(step.pipeline.pipeline)
                    current = step.pipeline
                compute.set_bind_group(0, self._bind_group(device, step, u_buf))
                compute.dispatch_workgroups(*step.groups)
            compute.end()
            # The last output's first word rides along as a fence: the
            # answer waits for the work even when nothing else is read.
            last = plan.steps[-1].output
            ranges = [(slot.buffer, slot.offset, pad_copy(slot)) for slot in plan.returns]
            if not any(slot is last and slot.logical for slot in plan.returns):
                ranges.append((last.buffer, last.offset, 4))
            read = finish_and_read(device, self.gpu, encoder, ranges)
            return [data[: slot.logical] for data, slot in zip(read, plan.returns)]
        finally:
            for kind, buf in taken:
                pool.give(kind, buf)

    def _take_temporaries(self, temporaries: list[Slot], taken: list) -> None:
        """One pooled buffer per temporary: WebGPU tracks read and write use
        per buffer, not per range, so temporaries cannot share one."""
        for slot in temporaries:
            slot.buffer = self.gpu.pool.take("session", slot.size)  # type: ignore[union-attr]
            taken.append(("session", slot.buffer))

    def _params(self, device: wgpu.GPUDevice, plan: ChainPlan, taken: list) -> wgpu.GPUBuffer | None:
        """Every step's params in one uniform buffer, each at an aligned offset."""
        total = 0
        for step in plan.steps:
            if step.params is not None:
                step.u_offset = total
                total += contract.align(_uniform_size(step.params), self.gpu.uniform_align)
        if not total:
            return None
        u_buf = self.gpu.pool.take("uniform", total)  # type: ignore[union-attr]
        taken.append(("uniform", u_buf))
        packed = bytearray(total)
        for step in plan.steps:
            if step.params is not None:
                packed[step.u_offset : step.u_offset + len(step.params)] = step.params
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

    def _bind_group(self, device: wgpu.GPUDevice, step, u_buf):
        params = (u_buf, step.u_offset, _uniform_size(step.params)) if step.params is not None else None
        entries = session_contract.group_entries(
            (step.input.buffer, step.input.offset, step.input.size),
            (step.output.buffer, step.output.offset, step.output.size),
            params,
            [(binding, slot.buffer, slot.offset, slot.size) for binding, slot in step.named],
        )
        return self.pipelines.bind_group(device, step.pipeline, entries)


def _uniform_size(params: bytes) -> int:
    return max(contract.align(len(params), contract.UNIFORM_ALIGN), contract.MIN_UNIFORM_BYTES)


def pad_copy(slot: Slot) -> int:
    """Bytes to copy back: whole words covering what the caller sees."""
    return contract.pad4(slot.logical)
