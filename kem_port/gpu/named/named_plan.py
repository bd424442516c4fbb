"""A named-buffer call's plan, made once per call signature and reused.

Everything NamedRuns.run decides before the GPU runs -- the entry point
(overrides applied), the bindings and their sizes, the dispatch and its
budget, the pipeline, the gas slot, the kit -- depends on the kernel, the
entry point, the constants set, the buffer names with their lengths, the
output sizes, the dispatch and the gas limit; never on the bytes. A call
whose signature was seen takes its plan and only writes its bytes: the
checks ran for the first call of that signature, with the same numbers.
Planning took ~35 us of a 4-byte call's ~190 us on the dev machine
(lavapipe); a repeat is one dict lookup.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kem_port.gpu import gas_meter
from kem_port.gpu.named.binding_model import Bound, NamedCall, keys_of
from kem_port.gpu.named.named_kit import NamedKit
from kem_port.gpu.constants import set_key

PLANS = 64  # signatures kept (each a few hundred bytes, no caller's bytes; its kit is bounded apart, named_kits.KITS)


@dataclass(frozen=True)
class NamedPlan:
    pipeline: object  # wgpu.GPUComputePipeline
    kit: NamedKit
    bound: list[Bound]  # the first call's bindings: roles, sizes and lengths (its bytes dropped, __post_init__)
    keys: tuple[str | None, ...]  # per binding, the key the call's bytes come under (None: an output)
    groups: tuple[int, int, int]
    slot: gas_meter.GasSlot | None
    invocations: int
    layouts: dict  # its pipeline's bind group layouts, by group: a replica kit is made on them (named_batch.py)
    gas_group: int | None
    shape: tuple  # its kit's key (named_run.NamedRuns._kit)

    def __post_init__(self) -> None:
        # Kept without the first call's bytes (given_keys read them first):
        # 64 plans held 64 callers' inputs, ~250 MiB for 3 MiB calls (red team).
        object.__setattr__(self, "bound", [replace(x, data=None) for x in self.bound])

    @property
    def cap(self) -> int:
        return self.slot.cap if self.slot else 0

    def datas(self, call: NamedCall) -> list[bytes | None]:
        """This call's bytes in binding order (same signature: same keys)."""
        buffers = call.buffers
        return [None if key is None else buffers[key] for key in self.keys]


def signature(sha256: str, call: NamedCall) -> tuple:
    """What a plan depends on. Buffer lengths, not bytes: a uniform's or an
    input's length sets its binding's size and the 1-D checks."""
    return (sha256, call.entry_point, set_key(call.constants) if call.constants else None,
            tuple((key, len(data)) for key, data in call.buffers.items()), tuple(call.outputs.items()),
            call.workgroups, call.grid, call.gas_limit)


def given_keys(bound: list[Bound], call: NamedCall) -> tuple[str | None, ...]:
    """Per binding, the key (WGSL name, "G/B" or "B") its bytes came under."""
    return tuple(None if x.data is None else next(k for k in keys_of(x.binding) if k in call.buffers) for x in bound)
