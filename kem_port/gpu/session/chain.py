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
from typing import Any

import wgpu

from kem_port.gpu import contract
from kem_port.gpu.session.chain_gas import ChainGas, plan_gas
from kem_port.gpu.session.chain_kit import ChainKit, keepable, tagged, uniform_size
from kem_port.gpu.session.chain_kits import ChainKits
from kem_port.gpu.session.chain_plan import Chain, ChainPlan, Planner
from kem_port.gpu.session.chain_steps import (PlannedClear, PlannedCopy, PlannedStep, Slot, bind_entry, clear_temporaries,
                                              pad_copy, upload_temporaries)
from kem_port.gpu.device import Device
from kem_port.gpu.hot_path import HotPath
from kem_port.gpu.named.named_run import SMALL_INVOCATIONS
from kem_port.gpu.session.session_pipelines import SessionPipelines
from kem_port.gpu.session.sessions import Session, finish_and_read
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.stats import Stats


# The most invocations a chain may launch on the reader: a lone kem@1.0
# call's (gpu/named/named_run.SMALL_INVOCATIONS: kem's 1-D rule on 64 KiB).
READER_INVOCATIONS = SMALL_INVOCATIONS


class NotForReader(Exception):
    """A chain planned on the reader whose work is too long to run there."""


@dataclass(frozen=True)
class ChainResult:
    """What a chain answers, and the gas it used (docs/metering.md): the
    figure a usage record carries for a session call or chain."""

    value: bytes | dict[str, bytes]
    gas: int


def kit_result(kit: ChainKit, results: list[bytes], gas: int) -> ChainResult:
    """A kit's run as the chain's answer: its one output, or its named buffers."""
    return ChainResult(results[0] if kit.names is None else dict(zip(kit.names, results)), gas)


class ChainRunner:
    def __init__(self, gpu: Device, stats: Stats, max_temp_bytes: int, request_bytes: int, gas_limit: int) -> None:
        self.gpu = gpu
        self.stats = stats
        self.pipelines = SessionPipelines(stats)
        self.max_temp_bytes = max_temp_bytes
        self.request_bytes = request_bytes
        self.gas_limit = gas_limit  # the node's KEM_GAS_LIMIT: a chain's budget when it gives none
        self.kits = ChainKits()  # request shapes run again without planning (chain_kit.py)
        self._kits_device: wgpu.GPUDevice | None = None

    def plan(self, chain: Chain) -> ChainPlan:
        return Planner(chain, self.gpu, self.pipelines, self.max_temp_bytes, self.request_bytes).plan()

    def run(self, chain: Chain, reader: bool = False, key: tuple | None = None) -> ChainResult:
        """Validate every step, then encode, submit and read back once.

        On the reader (`reader`: port/session_methods.py) a chain runs only
        when its planned work is a lone call's at most (READER_INVOCATIONS,
        no loop): else NotForReader is raised before anything is submitted,
        and the caller hands it to the GPU thread. A step's workgroups are
        the caller's word, and one 4-byte session call with workgroups
        {4096, 256, 1} would hold the reader (ping, call_state) for as
        long as the GPU runs it. Its wait spins as a lone call's there.

        With a `key` (the request's shape, wire/session_protocol.shape_key)
        a plan a kit may keep becomes that shape's kit (chain_kit.py), and
        this run is its first."""
        if key is not None:
            chain = tagged(chain)
        plan = self.plan(chain)
        gas = plan_gas(plan, chain.gas_limit, self.gas_limit, self.gpu.storage_align, self.gpu.gas_turns)
        if reader and (gas.meters or sum(count for _, count in gas.launched) > READER_INVOCATIONS):
            raise NotForReader
        spin_s = self.gpu.lone_spin_s if reader else self.gpu.spin_s
        if key is not None and keepable(plan, gas, chain):
            self._kits_for(self.gpu.require())
            kit = ChainKit(self.gpu.require(), chain, plan, gas, self.gpu.uniform_align)
            self.kits.keep(key, kit)
            self.stats.inc("chain_kits_built")
            return self._on_kit(key, kit, chain.input, chain.steps, spin_s)
        results, meter = self._execute(plan, gas, spin_s)
        self.stats.inc("chain_steps", len(plan.steps))
        used = gas.settle(meter)  # gas_exhausted, naming the step, once the chain has landed
        if not plan.named_result:
            return ChainResult(results[0], used)
        return ChainResult(dict(zip(plan.names, results)), used)

    def run_kit(self, key: tuple, session: Session | None, data: bytes, steps: Any, reader: bool = False) -> ChainResult | None:
        """A repeat of a kept shape on its kit, with the request's bytes
        (`steps`: the request's, for their params and buffers); None when
        no kit of that shape fits the session and device as they are now."""
        kit = self.kits.get(key)
        device = self.gpu.device
        if kit is None or not kit.fits(session, device):
            return None
        if reader and kit.invocations > READER_INVOCATIONS:
            raise NotForReader
        return self._on_kit(key, kit, data, steps, self.gpu.lone_spin_s if reader else self.gpu.spin_s)

    def _on_kit(self, key: tuple, kit: ChainKit, data: bytes, steps: Any, spin_s: float) -> ChainResult:
        try:
            results, gas = kit.run(self.gpu.hot, spin_s, data, steps)
        except BaseException:
            self.kits.drop(key)  # its buffers' state is unknown
            raise
        self.kits.used(key)
        self.stats.bump((("chain_steps", kit.steps), ("chain_kit_runs", 1)))
        return kit_result(kit, results, gas)

    def _kits_for(self, device: wgpu.GPUDevice) -> None:
        """A new device: the old one's kits go (their buffers with it)."""
        if device is not self._kits_device:
            self.kits.clear()
            self._kits_device = device

    def _execute(self, plan: ChainPlan, gas: ChainGas, spin_s: float) -> tuple[list[bytes], bytes]:
        """Encode, submit and read back on the hot path (gpu/hot_path.py:
        wgpu-native's C API where wgpu-py has it), as the batches do."""
        gpu = self.gpu
        gpu.require()
        path, pool = gpu.hot, gpu.pool
        assert pool is not None
        taken: list[tuple[str, wgpu.GPUBuffer]] = []
        try:
            self._take_temporaries(plan.temporaries, taken)
            u_buf = self._params(path, plan, taken, gas)
            meter_buf = None
            if gas.meter_bytes:
                meter_buf = pool.take("session", gas.meter_bytes)
                taken.append(("session", meter_buf))
            upload_temporaries(path, plan.temporaries)
            encoder = path.encoder()
            try:
                clear_temporaries(encoder, plan.temporaries)
                if meter_buf is not None:  # zeroed in this submission, before the first dispatch
                    encoder.clear_buffer(meter_buf, 0, gas.meter_bytes)
                self._encode(encoder, plan, u_buf, gas, meter_buf)
            except BaseException:
                encoder.abandon()
                raise
            # A buffer the last step writes rides along as a fence: the
            # answer waits for the work even when nothing else is read.
            fence = plan.steps[-1].written
            ranges = [(slot.buffer, slot.offset, pad_copy(slot)) for slot in plan.returns]
            if not any(slot is fence and slot.logical for slot in plan.returns):
                ranges.append((fence.buffer, fence.offset, 4))
            if meter_buf is not None:
                ranges.append((meter_buf, 0, gas.meter_bytes))
            read = finish_and_read(path, gpu, encoder, ranges, spin_s)
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

    def _encode(self, encoder, plan: ChainPlan, u_buf, gas: ChainGas, meter_buf) -> None:
        """Kernel steps in compute passes; a copy or clear between passes."""
        device = self.gpu.require()
        in_pass, current = False, None
        for index, step in enumerate(plan.steps):
            if type(step) is PlannedStep:
                if not in_pass:
                    encoder.begin_pass()
                    in_pass, current = True, None
                if step.pipeline is not current:
                    encoder.set_pipeline(step.pipeline.pipeline)
                    current = step.pipeline
                metered = gas.bind_entries(index, u_buf, meter_buf) if step.pipeline.gas_group is not None else None
                for group, bind_group in self._bind_groups(device, step, u_buf, metered):
                    encoder.set_bind_group(bind_group, group)
                encoder.dispatch(*step.groups)
                continue
            if in_pass:
                encoder.end_pass()
                in_pass = False
            if type(step) is PlannedCopy:
                if step.size:
                    encoder.copy(step.src.buffer, step.src.offset + step.src_offset,
                                 step.dst.buffer, step.dst.offset + step.dst_offset, step.size)
            elif type(step) is PlannedClear and step.size:
                encoder.clear_buffer(step.slot.buffer, step.slot.offset + step.offset, step.size)
        if in_pass:
            encoder.end_pass()

    def _params(self, path: HotPath, plan: ChainPlan, taken: list, gas: ChainGas) -> wgpu.GPUBuffer | None:
        """Every step's uniforms in one uniform buffer, each at an aligned
        offset, and the chain's gas cap after them when a step loops."""
        total = 0
        for step in plan.steps:
            if type(step) is PlannedStep:
                step.u_offsets = []
                for _, _, data in step.uniforms:
                    step.u_offsets.append(total)
                    total += contract.align(uniform_size(data), self.gpu.uniform_align)
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
        path.write(u_buf, 0, packed)
        return u_buf

    def _bind_groups(self, device: wgpu.GPUDevice, step: PlannedStep, u_buf,
                     metered: list[dict] | None) -> list[tuple[int, wgpu.GPUBindGroup]]:
        """The step's bind group of each group its layout has (the gas
        group's: `metered`), cached by their buffers."""
        entries: dict[int, list[dict]] = {group: [] for group in step.pipeline.layouts}
        if metered is not None:
            entries[step.pipeline.gas_group] = metered  # type: ignore[index]
        for group, binding, slot in step.storage:
            entries[group].append(bind_entry(binding, slot.buffer, slot.offset, slot.size))
        for (group, binding, data), at in zip(step.uniforms, step.u_offsets):
            entries[group].append(bind_entry(binding, u_buf, at, uniform_size(data)))
        return [(group, self.pipelines.bind_group(device, step.pipeline, found, group)) for group, found in entries.items()]
