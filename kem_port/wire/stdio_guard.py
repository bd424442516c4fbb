"""Keep the port's stdout for frames alone.

Native libraries (Vulkan loaders, drivers) and stray ``print`` calls write to
file descriptor 1. Before anything else is imported we duplicate the real
stdout to a private descriptor for the protocol, then point descriptor 1 (and
``sys.stdout``) at stderr, so whatever else is written there lands in the
node's log instead of corrupting a frame.
"""

from __future__ import annotations

from collections.abc import Callable

import os
import select
import sys
import threading
import time
from functools import partial


def claim_protocol_fds() -> tuple[int, int]:
    """Return (input_fd, output_fd) for frames; fd 1 then points at stderr."""
    out_fd = os.dup(1)
    os.set_inheritable(out_fd, False)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return 0, out_fd


def die_with_parent() -> None:
    """Ask Linux to kill us if the process that started us dies.

    The port's stdin reaching EOF is the normal signal (the reader thread
    exits on it); this covers a VM killed so hard that the pipe lingers in a
    surviving child. Best effort: other systems simply lack it.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def exit_on_hangup(fd: int) -> threading.Thread:
    """Exit the moment the node closes our input, whoever is busy.

    The reader sees EOF only when it next reads; while it runs a small call
    itself (router.py) or the GPU thread sits in a long kernel, this thread
    still notices the hang-up (POLLHUP, reported even with unread bytes
    left in the pipe) and ends the process, so no orphan outlives its node.
    """

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: POLLHUP/POLLERR always come
        while True:
            for _, event in poller.poll():
                if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    os._exit(0)

    thread = threading.Thread(target=watch, name="kem-hangup", daemon=True)
    thread.start()
    return thread


def input_waiting(fd: int) -> Callable[[], list]:
    """A cheap check (one zero-timeout poll) for bytes already in the pipe:
    a non-empty (true) list when some wait. The poll itself, not a function
    around it: a lone call asks once, where each Python call costs ~1 us
    with the caches cold (docs/benchmarks.md). The reader thread's alone: a
    poll object refuses a second thread polling at the same moment
    (RuntimeError), so other threads never ask (run_methods.py)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return partial(poller.poll, 0)


def spin_for_input(waiting: Callable[[], object], seconds: float) -> None:
    """Poll (input_waiting's poll) until bytes wait or `seconds` pass, so
    that the read that follows finds them instead of putting the thread to
    sleep: from Erlang on the dev machine, 50 us took one caller from
    4.5-4.8k to 5.5-6.2k calls/s (`scripts/bench wire 3`, alternating; the
    echo port's 11-12k -> 28-34k), 64 callers within the runs' noise; 100
    us cost 64 callers ~15% (docs/benchmarks.md, "The reader's spin")."""
    clock = time.perf_counter
    end = clock() + seconds
    while not waiting() and clock() < end:
        pass
