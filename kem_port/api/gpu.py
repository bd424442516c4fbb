"""The API's one door into the GPU layer (``gpu/``): which of its modules
and members ``kem_port.api`` and the ``kem`` command use, imported only when
first needed, so ``kem --help`` and ``kem publish --no-check`` never load
wgpu."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from kem_port.gpu.calls import KernelCall
    from kem_port.kernel_store import KernelSource


class GpuLayer(NamedTuple):
    """What the API and the ``kem`` command use of the GPU layer."""

    Executor: type
    Job: type
    choose_adapter: Callable[[str | None], Any]
    reflect: Callable[[str], Any]
    plan_dispatch: Callable[..., tuple[int, int, int]]
    dispatch_rule: Callable[..., str]  # (entry, workgroups, grid) -> the rule's name
    compile: Callable[[Any, KernelSource, KernelCall], Any]  # (executor, source, call) -> Pipeline
    dispatch_limits: Callable[[Any], Any]  # executor -> DispatchLimits
    run_debug: Callable[[Any, Any], tuple[bytes, dict]]  # (executor, job) -> (output, records); docs/debug.md


def gpu_layer() -> GpuLayer:
    """The one place that names the GPU layer's modules and members."""
    from kem_port.port import runtime_dir

    runtime_dir.ensure()  # before any driver loads: no Mesa XDG_RUNTIME_DIR notice on a script's stderr
    from kem_port.gpu import calls, debug_run, device, dispatch, executor
    from kem_port.gpu.wgsl import wgsl_reflect

    return GpuLayer(
        Executor=executor.Executor,
        Job=calls.Job,
        choose_adapter=device.choose_adapter,
        reflect=wgsl_reflect.reflect,
        plan_dispatch=dispatch.plan_dispatch,
        dispatch_rule=dispatch.rule_of,
        compile=lambda ex, source, call: ex.pipelines.get(ex.gpu.require(), source, call),
        dispatch_limits=lambda ex: ex.gpu.dispatch_limits,
        run_debug=debug_run.run_debug,
    )
