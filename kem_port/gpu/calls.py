"""What the GPU layer is asked to run: a checked kernel call, and a job
(the call, its kernel source and how to answer its caller).

The wire layer (protocol.py) builds KernelCalls from requests; the GPU
layer knows nothing of frames or terms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kem_port.errors import KemError
from kem_port.kernel_store import KernelSource
from kem_port.transfer.file_inputs import FileInput, FileParts




@dataclass(slots=True)
class KernelCall:
    """A checked call. Not frozen: made once a call on the reader, a frozen
    dataclass's __init__ took 1.1 us and this one's 0.3 (timeit); nothing
    hashes a call or changes one after it is made (the caches key on its
    fields), and equality still compares the fields."""

    kernel_id: str
    input: bytes | memoryview | FileInput | FileParts
    output_size: int
    params: bytes | None = None
    workgroups: tuple[int, int, int] | None = None
    entry_point: str = "main"
    output_path: str | None = None  # result goes to this shared-memory file
    debug: bool = False  # bind the debug channel (gpu/debug_run.py, docs/debug.md)
    grid: tuple[int, int, int] | None = None  # invocations; kem divides by the workgroup size (gpu/dispatch.py)
    # Pipeline-overridable constants, (name, value) sorted by name: a tuple
    # so that the pipeline cache and admission can key on it (gpu/constants.py).
    constants: tuple[tuple[str, int | float], ...] | None = None
    gas_limit: int | None = None  # the call's gas budget (docs/metering.md); None: the node's KEM_GAS_LIMIT
    usage: bool = False  # answer the call's gas beside its result (port/replies.py, docs/metering.md)

    @property
    def param_words(self) -> tuple[int, ...]:
        if not self.params:
            return ()
        usable = len(self.params) // 4 * 4
        return tuple(int.from_bytes(self.params[i : i + 4], "little") for i in range(0, usable, 4))

    @property
    def batch_bytes(self) -> int:
        """What the call puts in a batch's buffers: the larger of input and output."""
        return max(self.output_size, len(self.input))


@dataclass
class Job:
    call: KernelCall
    source: KernelSource
    reply: Callable[[memoryview], None]
    fail: Callable[[KemError], None]
    enqueued: float = field(default_factory=time.perf_counter)
    answered: bool = False
    tag: object = None  # the caller's id, for "where is this call?" (call_state.py)
    deadline: float | None = None  # time.monotonic() past which nobody waits for it
    calls: int = 1  # callers it answers (a GroupJob's slots, gpu/group_job.py)
    gas: int | None = None  # a usage call's gas, set by the road that ran it before it answers (docs/metering.md)

    @property
    def batch_bytes(self) -> int:
        """What it puts in a batch's buffers (the batch's byte cap, gpu_loop.py)."""
        return self.call.batch_bytes * self.calls

    def has_tag(self, tag: object) -> bool:
        return self.tag == tag

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def expire(self, now: float, error: KemError) -> None:
        """The deadline passed while queued: the caller hears `error`
        (GroupJob answers only its slots whose deadlines passed)."""
        self.refuse(error)

    def answer(self, view: memoryview) -> None:
        """Hand the caller its result, unless it was already answered."""
        if not self.answered:
            self.answered = True
            self.reply(view)

    def refuse(self, error: KemError) -> None:
        """Hand the caller an error, unless it was already answered."""
        if not self.answered:
            self.answered = True
            self.fail(error)


@dataclass(frozen=True)
class BatchCost:
    """What a landed batch cost, for the batch sizer (gpu_loop.py)."""

    calls: int
    seconds: float  # in all stages, waiting included
    largest_call_bytes: int
