"""The port's side of the compile worker (worker.py): start it, send a
kernel, read how it answered -- or how it died.

A worker that dies mid-compile is read by its exit: SIGSEGV (stack or
memory exhausted inside the compiler), SIGABRT (an allocation refused under
RLIMIT_DATA), SIGXCPU (the compile spent its CPU budget). The deadline that
decides is CPU time, measured by the worker's kernel (RLIMIT_CPU, reset for
each compile to what it used plus the budget): a compile bomb burns CPU,
while load only steals wall time. A wall deadline of WALL_BACKSTOP times the
budget remains for a worker that hangs without burning CPU; past it the
worker is killed. Either way the caller gets WorkerDied with a reason fit
for a client (no paths), and the guard starts a new worker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kem_port.errors import KemError
from kem_port.wire.framing import HEADER, read_frame

log = logging.getLogger("kem_port.admission.worker_client")

_SIGNALS = {signal.SIGSEGV: "crashed the shader compiler (out of stack or memory)", signal.SIGBUS: "crashed the shader compiler",
            signal.SIGABRT: "exhausted the compile memory budget", signal.SIGKILL: "exceeded the compile limits",
            signal.SIGXCPU: "exceeded the compile CPU time budget"}
# Under load wall time is not a compile's: on the 2-core test machine with
# 4 busy processes beside the suite, a 4,200-case kernel (1.0 s CPU idle)
# took 1.6 s of CPU but 12.4 s of wall time, so the old 4 s wall deadline
# of the tests refused it. The wall deadline only ends a worker that hangs
# without burning CPU: 3x the budget (60 s at the default 20 s).
WALL_BACKSTOP = 3.0


@dataclass(frozen=True)
class GuardSettings:
    timeout_s: float = 20.0  # a compile's CPU budget; WALL_BACKSTOP times it in wall time
    memory_mb: int = 1024
    zero_workgroup: str = "on"  # "on"; "auto": where the probe finds a leak; "off"
    adapter: str | None = None


    @property
    def cpu_s(self) -> int:
        return max(1, math.ceil(self.timeout_s))  # RLIMIT_CPU counts whole seconds


class WorkerDied(Exception):
    def __init__(self, why: str, cpu_exhausted: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.cpu_exhausted = cpu_exhausted  # killed by its CPU budget, which load does not spend


class CompileWorker:
    """One warm worker process; compile() sends a kernel and waits."""

    def __init__(self, settings: GuardSettings) -> None:
        env = dict(os.environ, KEM_COMPILE_MEMORY_MB=str(settings.memory_mb), KEM_COMPILE_CPU_S=str(settings.cpu_s))
        if settings.adapter:
            env["KEM_ADAPTER"] = settings.adapter
        self.settings = settings
        started = time.perf_counter()
        # stdout is this worker's protocol; its stderr joins the port's log.
        self.proc = subprocess.Popen([sys.executable, "-m", "kem_port.admission.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, bufsize=0, start_new_session=True)
        hello = self._read(max(settings.timeout_s, 60.0))
        self.leaks_workgroup = bool(hello.get("leaks_workgroup", True))
        self.adapter = str(hello.get("adapter", ""))
        self.open_s = time.perf_counter() - started

    def compile(self, request: dict) -> dict:
        body = json.dumps(request).encode()
        try:
            self.proc.stdin.write(HEADER.pack(len(body)) + body)
        except (BrokenPipeError, OSError):
            raise self._death() from None
        return self._read(self.settings.timeout_s * WALL_BACKSTOP)

    def _read(self, timeout_s: float) -> dict:
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            self.kill()
            raise WorkerDied(f"took longer than {timeout_s:.0f} s to compile")
        frame = read_frame(fd, 1 << 20)
        if frame is None:
            raise self._death()
        return json.loads(frame)

    def _death(self) -> WorkerDied:
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            return WorkerDied("stopped answering")
        if code < 0:
            return WorkerDied(_SIGNALS.get(-code, f"killed the compiler (signal {-code})"), cpu_exhausted=-code == signal.SIGXCPU)
        return WorkerDied(f"made the compiler exit ({code})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()


class WorkerSlot:
    """The guard's one worker: started in the background, replaced after it
    died or broke, waited for by the next kernel that needs it."""

    def __init__(self, settings: GuardSettings, opened: Callable[[float], None]) -> None:
        self.settings = settings
        self.worker: CompileWorker | None = None
        self._opened = opened  # told each new worker's start time (stats)
        self._spawning: threading.Thread | None = None

    def respawn(self) -> None:
        if self._spawning is not None and self._spawning.is_alive():
            return
        self._spawning = threading.Thread(target=self._spawn, name="kem-compile-spawn", daemon=True)
        self._spawning.start()

    def _spawn(self) -> None:
        try:
            self.worker = CompileWorker(self.settings)
            self._opened(self.worker.open_s)
        except Exception as exc:  # reported to the next kernel that needs it
            log.error("the compile worker did not start: %s", exc)

    def ready(self) -> CompileWorker:
        """The live worker; one started (and waited for) if there is none."""
        if self.worker is not None and self.worker.alive():
            return self.worker
        if self._spawning is None or not self._spawning.is_alive():
            self._spawn()
        else:
            self._spawning.join()
        if self.worker is None or not self.worker.alive():
            raise KemError("no_adapter", "the kernel compile worker is not available")
        return self.worker

    def retire(self, worker: CompileWorker) -> None:
        """worker died or broke: kill it and start a fresh one."""
        worker.kill()
        if self.worker is worker:
            self.worker = None
        self.respawn()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
