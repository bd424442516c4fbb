"""The port's main loop: read frames until stdin closes, then exit at once.

The reader (main) thread owns stdin. When the node closes it the process
ends with ``os._exit(0)``, even while a thread is inside a long kernel: the
reader exits at EOF, and a watchdog thread exits on the pipe's hang-up in
case the reader is busy running a call itself. No orphan keeps spinning on
the GPU, and no thread outlives it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from kem_port.admission.guard import guard_from_config
from kem_port.admission.worker import COMPILE_STACK_BYTES
from kem_port.wire import log_frames, terms
from kem_port.wire.batch_frames import MAX_CALLS_FRAME_BYTES, is_calls_frame
from kem_port.wire.group_frames import is_group_frame, req_ids_in_head
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.wire.etf_guard import peek_req_id
from kem_port.wire.framing import HEAD_KEPT, FrameWriter, OversizedFrame, read_frame
from kem_port.gpu.executor import Executor
from kem_port.kernel_store import KernelResolver, default_stores
from kem_port.port.native_stderr import CapturedStderr, forward
from kem_port.port.replies import Replies
from kem_port.port.router import Router
from kem_port.stats import Stats
from kem_port.wire.stdio_guard import die_with_parent, exit_on_hangup, input_waiting, spin_for_input

log = logging.getLogger("kem_port")
PORT_THREAD_STACK = 4 * COMPILE_STACK_BYTES


def build_remote(config: Config, stats: Stats):
    from kem_port.arweave.store import ArweaveStore

    return ArweaveStore(config, stats)


def start_error(writer: FrameWriter, captured: CapturedStderr | None, reason: str, detail: str) -> int:
    """An invalid setting: say why, as a frame the node's handshake reports
    (``{fatal, {Reason, Detail}}``) and on the original stderr for a person
    who started the port by hand; then exit 2."""
    writer.write([terms.encode((terms.atom("fatal"), (terms.atom(reason), terms.to_term(detail))))])
    if captured is not None:
        os.write(captured.original_fd, (detail + "\n").encode())
    return 2


def refuse_too_large(replies: Replies, head: bytes, detail: str) -> None:
    """A frame over the size limit: every caller of a group frame hears
    too_large, or the caller a ``{call, ReqId, ...}`` head names."""
    error = KemError("too_large", detail)
    req_ids = req_ids_in_head(head)
    if not req_ids:  # no group, or one whose Entries name nobody: as any unreadable frame
        replies.error(peek_req_id(head), error)
        return
    replies.refuse_all(req_ids, error)


def serve(in_fd: int, out_fd: int, captured: CapturedStderr | None = None) -> int:
    die_with_parent()
    exit_on_hangup(in_fd)
    # Two busy threads (reader, GPU) hand requests over: a waiting thread
    # otherwise gets the GIL only after the default 5 ms switch interval.
    sys.setswitchinterval(0.0002)
    writer = FrameWriter(out_fd)
    try:
        config = Config.from_env()
    except SystemExit as exc:
        return start_error(writer, captured, "bad_config", str(exc.code))
    context = {"port_index": int(os.environ.get("KEM_PORT_INDEX", "0") or 0), "os_pid": os.getpid()}
    log_frames.install(writer, config.log_level, context, captured.original_fd if captured else None)
    if captured is not None:
        forward(captured)
    stats = Stats()
    executor = Executor(config, stats)
    open_error: Exception | None = None
    try:
        executor.open()
        context["adapter"] = executor.info.get("name", "")
    except Exception as exc:  # keep serving: kernel calls will say no_adapter
        open_error = exc
    # Threads made from here on (the GPU thread compiles pipelines) get 4x
    # the stack a kernel was allowed in the compile worker, whatever
    # RLIMIT_STACK the node runs under (admission/worker.py).
    threading.stack_size(PORT_THREAD_STACK)
    resolver = KernelResolver(default_stores(config.kernel_dir), build_remote(config, stats))
    waiting = input_waiting(in_fd)
    replies = Replies(writer, stats)
    router = Router(config, stats, executor, resolver, replies, waiting, guard_from_config(config, stats), open_error)
    router.start()
    limit = max(config.max_frame_bytes, MAX_CALLS_FRAME_BYTES)
    spin_s = config.read_spin_us / 1e6
    try:
        while True:
            if spin_s:  # awake when a lone caller's next call comes (stdio_guard.spin_for_input)
                spin_for_input(waiting, spin_s)
            try:
                frame = read_frame(in_fd, limit)
            except OversizedFrame as exc:
                refuse_too_large(replies, exc.head, str(exc))
                continue
            if frame is None:
                break
            if len(frame) > config.max_frame_bytes and not (is_calls_frame(frame) or is_group_frame(frame)):
                # Read whole only because calls and group frames may be this large.
                refuse_too_large(replies, frame[:HEAD_KEPT], str(OversizedFrame(len(frame), config.max_frame_bytes)))
                continue
            router.handle_frame(frame)
    except (BrokenPipeError, ConnectionResetError):
        pass
    log.info("stdin closed; exiting")
    os._exit(0)

