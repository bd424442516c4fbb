"""A lone small call run inline on the reader (intake.py's last step for
a call that may): whether it may, and its run.

Run on the reader, a call's Python after the GPU wait meets caches the
driver's work has emptied, and each Python call there costs ~1 us
(docs/benchmarks.md, "The reader's Python after the GPU wait"); so a call
that queues builds nothing here, and the answer is written first.
"""

from __future__ import annotations

from collections.abc import Callable

from kem_port.wire import log_frames
from kem_port.errors import KemError
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.gpu.wgsl.wgsl_calls import may_loop
from kem_port.port.gpu_loop import SMALL_CALL, GpuLoop
from kem_port.kernel_store import KernelSource
from kem_port.stats import Stats


def may_run_inline(call: KernelCall, source: KernelSource, executor: Executor, input_waiting: Callable[[], bool]) -> bool:
    """Only calls that cannot hold the reader long: small, no explicit workgroup
    count, no shared-memory result, kernel compiled, no loop statement in the
    entry point's reachable code (WGSL has no recursion, so only a loop can
    run long: gpu/wgsl_calls.py; parsed once per kernel, a dict lookup here),
    no other frame in the pipe. A kernel that may loop runs on the GPU
    thread, so the reader keeps answering ping and call_state meanwhile."""
    return not (  # the sizes, not batch_bytes: one Python call fewer
        len(call.input) > SMALL_CALL or call.output_size > SMALL_CALL
        or call.workgroups is not None
        or call.output_path is not None
        or not executor.is_warm(source, call)
        or may_loop(source.text, source.sha256, call.entry_point)
        or input_waiting()
    )


def run_lone(loop: GpuLoop, stats: Stats, reply: Callable[[int, KernelCall, memoryview], None],
             fail: Callable[[int, KemError], None], req_id: int, call: KernelCall, source: KernelSource,
             release: Callable[[], None], deadline_at: float | None) -> bool:
    """Run the call inline and answer it (True), or False when the GPU
    thread is busy or has work queued: then it queues, and nothing was
    built for it. Its answer is written before its budget share goes back
    (shares are taken only on the reader, busy here until this returns); a
    queued job releases first, as the GPU thread may answer it while the
    reader takes the caller's next call."""

    def answer(view: memoryview) -> None:
        try:
            reply(req_id, call, view)
        finally:
            release()

    def refuse(error: KemError) -> None:
        release()
        log_frames.kernel_failed(call.kernel_id, error)
        fail(req_id, error)

    if not loop.run_inline(Job(call, source, answer, refuse, tag=req_id, deadline=deadline_at)):
        return False
    stats.count_on_reader("inline_calls")
    return True
