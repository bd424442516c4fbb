"""The ``test_hook`` method (``KEM_TEST_HOOKS=1`` only): faults on demand
for the fault tests (docs/protocol.md)."""

from __future__ import annotations

import os
import time

from kem_port.wire import terms
from kem_port.errors import KemError
from kem_port.gpu.executor import Executor
from kem_port.config import Config
from kem_port.port.gpu_loop import Control, GpuLoop, QueueFull
from kem_port.wire.protocol import RequestError
from kem_port.port.replies import Replies
from kem_port.admission.guard import CompileGuard


USAGE = "test_hook {stdout_noise | destroy_device | sleep_gpu, Ms | sleep_reader, Ms | fail_next_compile, crash | stall | break}"
OK = terms.atom("ok")
COMPILE_FAULTS = ("crash", "stall", "break")  # what the compile worker does to its next kernel (admission/worker.py)


def handle(config: Config, loop: GpuLoop, guard: CompileGuard | None, replies: Replies, req_id: int, args: tuple) -> None:
    if not config.test_hooks:
        raise RequestError(req_id, KemError("unknown_method", "test_hook is off (KEM_TEST_HOOKS=1)"))
    what = terms.atom_name(args[0]) if args else None
    if what == "stdout_noise":
        # What a misbehaving native library might do.
        print("noise from print()")
        os.write(1, b"noise written to fd 1\n")
        replies.ok(req_id, OK)
    elif what == "destroy_device":
        control(loop, replies, req_id, lambda ex: ex.destroy_device_for_test())
    elif what == "sleep_gpu" and len(args) == 2 and type(args[1]) is int:
        control(loop, replies, req_id, lambda ex, ms=args[1]: time.sleep(ms / 1000))
    elif what == "sleep_reader" and len(args) == 2 and type(args[1]) is int:
        time.sleep(args[1] / 1000)  # a reader stuck in an inline call
        replies.ok(req_id, OK)
    elif what == "fail_next_compile" and len(args) == 2 and terms.atom_name(args[1]) in COMPILE_FAULTS:
        # The next new kernel's first compile fails as a loaded node or a
        # worn worker may fail it (tests/test_compile_guard.py).
        guard.fail_next_compile(  # type: ignore[union-attr]
            terms.atom_name(args[1]))
        replies.ok(req_id, OK)
    else:
        raise RequestError(req_id, KemError("bad_args", USAGE))


def control(loop: GpuLoop, replies: Replies, req_id: int, action: Control) -> None:
    """Run action on the GPU thread, tagged with req_id (call_state.py)."""

    def run(executor: Executor) -> None:
        action(executor)
        replies.ok(req_id, OK)

    run.tag = req_id  # type: ignore[attr-defined]
    try:
        loop.put(run)
    except QueueFull:
        raise RequestError(req_id, KemError("overloaded", "the GPU queue is full")) from None
