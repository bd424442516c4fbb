"""A chain's kit: a validated chain's plan kept, so a repeat of the same
request shape runs with no planning at all (docs/sessions.md, "The road a
step takes").

A resident step or short chain is asked again and again with new bytes
and the same shape: the same kernels, options, buffer names and byte
counts in the same session. Planned afresh, each repeat paid ~170 us of
Python on lavapipe for a 4-byte step and ~400 us for ten `double` steps
(resolving and admitting each step, the planner's checks, the gas plan,
pooled buffers, uniform packing, bind group keys), against ~20 us for a
lone kem@1.0 call on its kit (gpu/lone_kit.py). A kit is built from the
first run's plan, which every check passed, and holds:

* its own temporaries (cleared, or written whole with the request's bytes,
  every run), uniform buffer (packed whole every run) and staging buffer;
* every step's pipeline and bind groups, and the encoder's commands in order;
* where each uploaded byte string comes from in the request (its input, a
  step's params, a step's own buffers): the plan is made from :class:`Tagged`
  bytes that carry their origin.

**What a repeat may change.** Only byte contents: the key holds everything
else (``wire/session_protocol.shape_key``: kernels, entry points, options,
names, byte counts, constants by ``set_key``). A kit answers only for the
session it was planned in, while its buffers are those it was planned
with (``Session.generation`` counts creates and frees: a new buffer can
change what a name binds), on the device it was built on, and the port
checks each kernel's file is the one admitted (its sha256). Not kept:
a chain with a looping step (its gas cap and meters are the GPU thread's),
a dispatch read from the params' words (the image rule: new params may
size it anew), or one over KIT_BYTES of buffers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import wgpu

from kem_port.gpu import contract
from kem_port.gpu.hot_path import HotPath, write_whole
from kem_port.gpu.native import NativePath
from kem_port.gpu.session.chain_gas import ChainGas
from kem_port.gpu.session.chain_steps import Chain, ChainPlan, PlannedClear, PlannedCopy, PlannedStep, Step, bind_entry
from kem_port.gpu.session.kit_commands import compile_commands, encode_native, encode_wrapped
from kem_port.gpu.session.sessions import Session

KIT_BYTES = 64 << 10  # a kit's temporaries, uniforms and staging: a lone call's bytes (gpu/lone_road.KIT_LIMIT)
_U = wgpu.BufferUsage


class Tagged(bytes):
    """Bytes that remember where in the request they came from."""

    origin: tuple


def _tag(data: bytes | memoryview | None, origin: tuple) -> Tagged | None:
    if data is None:
        return None
    tagged = Tagged(data)
    tagged.origin = origin
    return tagged


def tagged(chain: Chain) -> Chain:
    """The chain with its input, params and steps' own bytes tagged by origin."""
    steps = tuple(replace(s, params=_tag(s.params, ("params", i)),
                          buffers={k: _tag(v, ("buffer", i, k)) for k, v in s.buffers.items()})
                  if type(s) is Step else s for i, s in enumerate(chain.steps))
    return replace(chain, steps=steps, input=_tag(chain.input, ("input",)))


def _bytes_of(origin: tuple, data: bytes, steps: Any) -> bytes:
    if origin[0] == "input":
        return data
    if origin[0] == "params":
        return steps[origin[1]].params
    return steps[origin[1]].buffers[origin[2]]


def uniform_size(params: bytes) -> int:
    return max(contract.align(len(params), contract.UNIFORM_ALIGN), contract.MIN_UNIFORM_BYTES)


class ChainKit:
    """One request shape's plan, buffers and commands; not thread-safe (the
    executor lock's holder, reader or GPU thread, runs one chain at a time)."""

    def __init__(self, device: wgpu.GPUDevice, chain: Chain, plan: ChainPlan, gas: ChainGas, uniform_align: int) -> None:
        self.device, self.session = device, chain.session
        self.chain = chain  # planned again for a replica (a batch's second run of this shape: chain_batch.py)
        self.generation = chain.session.generation if chain.session is not None else 0
        self.held = chain.session.bytes if chain.session is not None else 0  # the session's bytes it was planned with
        self.steps = len(plan.steps)
        self.gas = sum(count for _, count in gas.launched)  # loop-free: its gas is what it launches
        self.invocations = self.gas
        # Each kernel's sha256 as admitted: the port runs the kit only while its file still has it.
        self.sources = {s.source.kernel_id: s.source.sha256 for s in chain.steps if type(s) is Step}
        self.owned: list[wgpu.GPUBuffer] = []
        self.uploads: list[tuple[wgpu.GPUBuffer, tuple, int]] = []
        self.clears: list[tuple[wgpu.GPUBuffer, int]] = []
        self.bytes = sum(slot.size for slot in plan.temporaries)
        for slot in plan.temporaries:
            slot.buffer = self._own(slot.size, _U.STORAGE | _U.COPY_SRC | _U.COPY_DST, "kem-chain-temp")
            if slot.upload is None:
                self.clears.append((slot.buffer, slot.size))
            else:
                self.uploads.append((slot.buffer, slot.upload.origin, slot.size))
        self.u_size, self.u_parts = 0, []
        for step in plan.steps:
            if type(step) is PlannedStep:
                step.u_offsets = []
                for _, _, data in step.uniforms:
                    step.u_offsets.append(self.u_size)
                    self.u_parts.append((self.u_size, data.origin))
                    self.u_size += contract.align(uniform_size(data), uniform_align)
        self.u_buf = self._own(self.u_size, _U.UNIFORM | _U.COPY_DST, "kem-chain-uniforms") if self.u_size else None
        ops = _program(device, plan, self.u_buf)
        fence = plan.steps[-1].written
        ranges = [(slot.buffer, slot.offset, contract.pad4(slot.logical)) for slot in plan.returns]
        if not any(slot is fence and slot.logical for slot in plan.returns):
            ranges.append((fence.buffer, fence.offset, 4))  # the answer waits for the work
        self.copies, at = [], 0
        for buf, offset, length in ranges:
            self.copies.append((buf, offset, at, length))
            at += length
        self.staging_size = max(at, 4)
        self.staging = self._own(self.staging_size, _U.MAP_READ | _U.COPY_DST, "kem-chain-staging")
        # Every command of a run, in order: temporaries cleared, the steps, the copies to staging.
        self.ops = ([("clear_buffer", (buf, 0, size)) for buf, size in self.clears] + ops
                    + [("copy", (buf, offset, self.staging, at, length)) for buf, offset, at, length in self.copies])
        self.native: tuple[NativePath, list] | None = None  # the commands as C calls (kit_commands.py)
        self.logical = [slot.logical for slot in plan.returns]
        self.names = plan.names if plan.named_result else None

    def _own(self, size: int, usage: int, label: str) -> wgpu.GPUBuffer:
        buf = self.device.create_buffer(size=size, usage=usage, label=label)
        self.owned.append(buf)
        return buf

    def fits(self, session: Session | None, device: wgpu.GPUDevice | None) -> bool:
        """Whether this kit may run for `session` now (the buffers it was planned with)."""
        if device is not self.device or session is not self.session:
            return False
        return session is None or session.generation == self.generation

    def run(self, path: HotPath, spin_s: float, data: bytes, steps: Any) -> tuple[list[bytes], int]:
        """One run with the request's bytes: (the returned buffers' bytes, gas)."""
        self.upload(path, data, steps)
        if isinstance(path, NativePath):
            commands = encode_native(path, [self.commands(path)])
        else:
            commands = encode_wrapped(path.encoder(), self.ops)
        index = path.submit(commands)
        path.wait(path.map_read(self.staging, 0, self.staging_size), spin_s, index)
        return self.read(path)

    def upload(self, path: HotPath, data: bytes, steps: Any) -> None:
        """The request's bytes into the kit's temporaries and uniforms."""
        for buf, origin, size in self.uploads:
            write_whole(path, buf, _bytes_of(origin, data, steps), size)
        if self.u_buf is not None:
            packed = bytearray(self.u_size)
            for at, origin in self.u_parts:
                src = _bytes_of(origin, data, steps)
                packed[at : at + len(src)] = src
            path.write(self.u_buf, 0, packed)

    def commands(self, path: NativePath) -> list:
        """The kit's commands as C calls (kit_commands.py), made once a path."""
        if self.native is None or self.native[0] is not path:
            self.native = (path, compile_commands(path, self.ops))
        return self.native[1]

    def read(self, path: HotPath) -> tuple[list[bytes], int]:
        """The returned buffers off the mapped staging buffer, then unmapped; and the gas."""
        try:
            view = path.mapped(self.staging, 0, self.staging_size)
            return [bytes(view[at : at + n]) for (_, _, at, _), n in zip(self.copies, self.logical)], self.gas
        finally:
            path.unmap(self.staging)

    def retire(self) -> None:
        for buf in self.owned:
            buf.destroy()
        self.owned = []


def _program(device: wgpu.GPUDevice, plan: ChainPlan, u_buf) -> list[tuple[str, tuple]]:
    """The encoder's calls for every step, in order (ChainRunner._encode's, with the bind groups made once)."""
    ops: list[tuple[str, tuple]] = []
    in_pass, current = False, None
    for step in plan.steps:
        if type(step) is PlannedStep:
            if not in_pass:
                ops.append(("begin_pass", ()))
                in_pass, current = True, None
            if step.pipeline is not current:
                ops.append(("set_pipeline", (step.pipeline.pipeline,)))
                current = step.pipeline
            entries: dict[int, list[dict]] = {group: [] for group in step.pipeline.layouts}
            for group, binding, slot in step.storage:
                entries[group].append(bind_entry(binding, slot.buffer, slot.offset, slot.size))
            for (group, binding, data), at in zip(step.uniforms, step.u_offsets):
                entries[group].append(bind_entry(binding, u_buf, at, uniform_size(data)))
            for group, found in entries.items():
                ops.append(("set_bind_group", (device.create_bind_group(layout=step.pipeline.layouts[group], entries=found), group)))
            ops.append(("dispatch", tuple(step.groups)))
            continue
        if in_pass:
            ops.append(("end_pass", ()))
            in_pass = False
        if type(step) is PlannedCopy and step.size:
            ops.append(("copy", (step.src.buffer, step.src.offset + step.src_offset,
                                 step.dst.buffer, step.dst.offset + step.dst_offset, step.size)))
        elif type(step) is PlannedClear and step.size:
            ops.append(("clear_buffer", (step.slot.buffer, step.slot.offset + step.offset, step.size)))
    if in_pass:
        ops.append(("end_pass", ()))
    return ops


def keepable(plan: ChainPlan, gas: ChainGas, chain: Chain) -> bool:
    """Whether a kit may keep this plan: loop-free, no dispatch read from
    params (the image rule), every upload tagged, within KIT_BYTES."""
    if gas.meters:
        return False
    for step, asked in zip(plan.steps, chain.steps):
        if type(step) is not PlannedStep:
            continue
        if step.pipeline.gas_group is not None:
            return False
        size = step.pipeline.shape.entry.workgroup_size if step.pipeline.shape.entry is not None else None
        if asked.workgroups is None and asked.grid is None and (size is None or size[1] > 1 or size[2] > 1):
            return False
        if any(not hasattr(data, "origin") for _, _, data in step.uniforms):
            return False
    if any(slot.upload is not None and not hasattr(slot.upload, "origin") for slot in plan.temporaries):
        return False
    held = sum(slot.size for slot in plan.temporaries) + sum(contract.pad4(slot.logical) for slot in plan.returns)
    uniforms = sum(len(data) + 256 for step in plan.steps if type(step) is PlannedStep for _, _, data in step.uniforms)
    return held + uniforms <= KIT_BYTES
