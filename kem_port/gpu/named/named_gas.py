"""Gas on the named-buffer road (docs/metering.md, "Named-buffer runs").

A named run binds the kernel's own layout, in any of WebGPU's four groups,
so a looping kernel's meter goes to its gas group (gpu/wgsl/wgsl_gas.py
``gas_group``: the lowest group the kernel leaves free): the cap (16-byte
uniform) at binding 0 and the meter (16-byte storage) at binding 1 there,
buffers of the call shape's kit (named_kit.py), the meter cleared before
the dispatch and read back in the same staging copy as the outputs. The
budget is the call's ``gas_limit`` option, else the node's KEM_GAS_LIMIT,
spread over the invocations as on the execute road (gas_meter.py).
"""

from __future__ import annotations

from dataclasses import replace

from kem_port.errors import KemError
from kem_port.gpu import gas_meter
from kem_port.gpu.named.binding_model import Bound, Limits
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.gpu.wgsl.wgsl_reflect import KernelShape, reflect
from kem_port.kernel_store import KernelSource


class NamedOutputs(dict):
    """A named run's returned buffers by WGSL name (a dict, as before), with
    the call's gas: invocations launched plus the meter's loop iterations
    (docs/metering.md), for the usage record to carry."""

    gas: int = 0


def gas_text(source: KernelSource) -> tuple[str, int | None]:
    """(text to compile, the meter's bind group or None when unmetered).
    Admission made the gas form already when source.metered is not None
    (admission/guard.py, admit_for_session(gas=True)): that exact text runs.
    A kernel that was not admitted (no guard, a packaged kernel) gets its
    form here, the same text admission would have made."""
    if source.metered is None:
        form = wgsl_gas.named_gas_form(source.text)
        return form.text, form.group if form.metered else None
    if not source.metered:
        return source.text, None
    meter = next((b for b in reflect(source.text).bindings if b.name == "kem_gas_meter"), None)
    if meter is None:  # an admitted gas form always declares it: never run a loop unmetered
        raise KemError("bad_kernel", "kem's gas meter is missing from the admitted text")
    return source.text, meter.group


def kernel_shape(shape: KernelShape) -> KernelShape:
    """The kernel's own bindings: kem's cap and meter (in an admitted gas form) left out."""
    if not any(b.name.startswith(wgsl_gas.PREFIX) for b in shape.bindings):
        return shape
    return replace(shape, bindings=tuple(b for b in shape.bindings if not b.name.startswith(wgsl_gas.PREFIX)))


def check_room(bound: list[Bound], limits: Limits) -> None:
    """The meter is one more storage buffer and the cap one more uniform in
    the compute stage: a kernel using all of WebGPU's 8 storage buffers and
    a loop is refused here with the reason, not by the device's layout."""
    storage = sum(1 for x in bound if x.role != "uniform")
    uniforms = len(bound) - storage
    if storage + 1 > limits.storage_per_stage or uniforms + 1 > limits.uniform_per_stage:
        raise KemError("bad_kernel", f"a kernel with a loop may use {limits.storage_per_stage - 1} storage and "
                                     f"{limits.uniform_per_stage - 1} uniform buffers: kem's gas meter and cap "
                                     "take one of each of WebGPU's per-stage limits (docs/metering.md)")


def outputs(returned: dict[str, bytes], words: tuple[int, ...] | None, slot: gas_meter.GasSlot | None,
            launched: int) -> NamedOutputs:
    """The call's outputs with its gas; KemError gas_exhausted (the execute
    road's detail) when an invocation passed its cap: no output then."""
    result = NamedOutputs(returned)
    if slot is None or words is None:
        result.gas = launched
        return result
    gas, ran_out = gas_meter.meter_gas(words, slot.invocations)
    if ran_out:
        raise gas_meter.exhausted(gas, slot)
    result.gas = gas
    return result
