"""What a chain is made of: its steps as asked for (kernel, copy, clear),
the buffers they bind (slots), and the steps once planned.

A kernel step binds buffers by the rules of docs/sessions.md ("The
binding rule"); a **copy** step copies a range of one buffer into another
and a **clear** step zeroes a range, both by the GPU's copy commands in
the chain's one submission (chain_copy.py checks them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import wgpu

from kem_port.errors import KemError
from kem_port.gpu.contract import pad4
from kem_port.gpu.hot_path import HotPath, write_whole
from kem_port.gpu.session.session_pipelines import SessionPipeline
from kem_port.gpu.session.sessions import Session
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
    constants: tuple[tuple[str, int | float], ...] | None = None  # pipeline constants (gpu/constants.py)
    buffers: dict[str, bytes] = field(default_factory=dict)  # this step's own bytes, by WGSL name
    outputs: dict[str, int] = field(default_factory=dict)  # new buffers a read_write binding makes, by name

    @property
    def param_words(self) -> tuple[int, ...]:
        data = self.params or b""
        return tuple(int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data) // 4 * 4, 4))


@dataclass(frozen=True)
class CopyStep:
    """``#{copy => {Src, SrcOffset, Dst, DstOffset, Size}}``: bytes, whole words."""

    src: str
    src_offset: int
    dst: str
    dst_offset: int
    size: int


@dataclass(frozen=True)
class ClearStep:
    """``#{clear => {Buffer, Offset, Size}}``: zeroes, whole words."""

    buffer: str
    offset: int
    size: int


AnyStep = Step | CopyStep | ClearStep


@dataclass(frozen=True)
class Chain:
    steps: tuple[AnyStep, ...]
    input: bytes | memoryview = b""
    returns: tuple[str, ...] | None = None  # None: the last kernel step's output (bytes, or its outputs by name)
    session: Session | None = None
    gas_limit: int | None = None  # the whole chain's gas budget (chain_gas.py); None: the node's KEM_GAS_LIMIT
    max_bytes: int | None = None  # the request's bytes and work (chain_budget.py), under the port's own


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
    upload: bytes | memoryview | None = None  # bytes it starts with (the chain's input, a step's own buffer)

    @property
    def size(self) -> int:
        return max(pad4(self.logical), 4)  # what is bound and allocated


@dataclass
class PlannedStep:
    """A dispatch: its storage buffers and uniform bytes at (group, binding)."""

    pipeline: SessionPipeline
    groups: tuple[int, int, int]
    storage: list[tuple[int, int, Slot]]
    uniforms: list[tuple[int, int, bytes]]
    output: Slot | None  # a kem@1.0-shaped kernel's binding 1
    results: dict[str, Slot]  # what the step returns as the chain's last: its new and in/out buffers by name
    written: Slot  # a buffer it writes (the chain's fence)
    u_offsets: list[int] = field(default_factory=list)  # each uniform's place in the chain's uniform buffer


@dataclass
class PlannedCopy:
    src: Slot
    src_offset: int
    dst: Slot
    dst_offset: int
    size: int

    @property
    def written(self) -> Slot:
        return self.dst


@dataclass
class PlannedClear:
    slot: Slot
    offset: int
    size: int

    @property
    def written(self) -> Slot:
        return self.slot


@dataclass
class ChainPlan:
    steps: list[PlannedStep | PlannedCopy | PlannedClear]
    temporaries: list[Slot]
    returns: list[Slot]
    named_result: bool
    names: list[str] = field(default_factory=list)  # the returned buffers' names, when named_result


def upload_temporaries(path: HotPath, temporaries: list[Slot]) -> None:
    """The chain's input (and a step's own bytes) uploaded whole,
    zero-padded to the bound size; pooled buffers hold earlier bytes."""
    for slot in temporaries:
        if slot.upload is not None:
            write_whole(path, slot.buffer, slot.upload, slot.size)


def clear_temporaries(encoder, temporaries: list[Slot]) -> None:
    """Every temporary without bytes to start with is cleared in the
    chain's own submission, before its first step."""
    for slot in temporaries:
        if slot.upload is None:
            encoder.clear_buffer(slot.buffer, 0, slot.size)


def bind_entry(binding: int, buffer: wgpu.GPUBuffer, offset: int, size: int) -> dict:
    """A bind group entry over a buffer range (a chain's plans and kits)."""
    return {"binding": binding, "resource": {"buffer": buffer, "offset": offset, "size": size}}


def pad_copy(slot: Slot) -> int:
    """Bytes to copy back: whole words covering what the caller sees."""
    return pad4(slot.logical)
