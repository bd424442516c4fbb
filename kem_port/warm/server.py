"""The warm process: one device, one Runner, the ``kem`` command's own
code, one command at a time; it ends after IDLE_EXIT_S without a command.

Each command arrives as argv, cwd and the client's three standard streams
(file descriptors passed over the socket). It runs in ``kem_port.cli.main``
with ``sys.stdin``/``stdout``/``stderr`` set to those streams, so every
byte, message and exit code is what the same command prints cold; only
the Runner is the shared one (cli/common.runner). Nothing is ``dup2``'d
onto fds 0-2: a compile worker the guard respawns mid-command inherits the
process's own streams, never a client's pipe (which would keep a reader of
``kem run ... | head`` waiting for EOF). The device and the first worker
start before the first command for the same reason.

What pays for this second road (docs/cli.md): a cold `kem run` of a new
kernel took 4.0-5.7 s on lavapipe (the guard's worker start 1.5-2.4 s,
device open 0.5-1.2 s, wgpu import 0.5-0.7 s), the same command warm
0.41-0.90 s, same bytes; a cached guard verdict alone would save ~2 s.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path

from kem_port.warm.client import HEADER, MAX_REQUEST, key

IDLE_EXIT_S = 600.0  # ten minutes without a command: the device and its memory go back
ACCEPT_POLL_S = 5.0
log = logging.getLogger("kem_port.warm")


class _CurrentStderr(logging.Handler):
    """Log records go to the current command's stderr (sys.stderr when emitted)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


def serve(path: Path, idle_exit_s: float = IDLE_EXIT_S) -> int:
    lock = open(path.with_suffix(".lock"), "w")  # held for this process's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another warm process of this key is starting or serving
    from kem_port.api import Runner
    from kem_port.cli import common

    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("kem: %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get("KEM_LOG", "WARNING").upper(), handlers=[handler])
    runner = Runner()
    runner.executor  # noqa: B018 (opens the device now, not in a client's command)
    runner.guard.start()
    common.use_warm_runner(runner)
    path.unlink(missing_ok=True)  # a stale socket of an ended process: the lock says none serves it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    listener.settimeout(min(ACCEPT_POLL_S, idle_exit_s))
    signal.signal(signal.SIGTERM, _stop)  # ends through the finally below: the socket file goes too
    last = time.monotonic()
    started_key = key()
    try:
        while time.monotonic() - last < idle_exit_s:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                # kem_port's sources changed (the key holds their newest
                # mtime): no client will ask this process again, they start
                # a new one; it ends now rather than holding a device and
                # its worker (~260 MB on lavapipe) for the idle minutes, one
                # such process per edit of a checkout.
                if key() != started_key:
                    break
                continue
            with conn:
                _one(conn, runner)
            last = time.monotonic()
    except _Stopped:
        pass
    finally:
        path.unlink(missing_ok=True)
        listener.close()
        runner.close()
    return 0


class _Stopped(BaseException):
    """SIGTERM: not a SystemExit, which a command's argparse raises and _run catches."""


def _stop(signum: int, frame) -> None:
    raise _Stopped


def _one(conn: socket.socket, runner) -> None:
    conn.settimeout(30.0)  # for the request's bytes only; the command itself may take long
    uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
    if uid != os.getuid():
        return  # the directory is 0700 already: this is the second lock
    try:
        data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
    except OSError:
        return
    try:
        request = _request(conn, data) if len(fds) == 3 else None
        if request is None:
            return
        conn.settimeout(None)
        code = _run(request, fds, runner)
        conn.sendall(json.dumps({"code": code, "pid": os.getpid()}).encode() + b"\n")
    except OSError:
        pass  # the client left: nothing to answer
    finally:
        for fd in fds:
            os.close(fd)


def _request(conn: socket.socket, data: bytes) -> dict | None:
    if len(data) < HEADER.size:
        return None
    (size,) = HEADER.unpack_from(data)
    if size > MAX_REQUEST:
        return None
    body = data[HEADER.size :]
    while len(body) < size:
        chunk = conn.recv(min(65536, size - len(body)))
        if not chunk:
            return None
        body += chunk
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past the parser: dropped, the loop serves on
        return None
    ok = isinstance(request, dict) and isinstance(request.get("cwd"), str) and isinstance(request.get("argv"), list)
    return request if ok and all(isinstance(a, str) for a in request["argv"]) else None


def _run(request: dict, fds: list[int], runner) -> int:
    from kem_port.cli import main

    saved = sys.stdin, sys.stdout, sys.stderr
    streams = [_stream(fds[0], "r"), _stream(fds[1], "w"), _stream(fds[2], "w")]
    sys.stdin, sys.stdout, sys.stderr = streams
    runner.timings = type(runner.timings)()  # this command's timings only (-v)
    umask = request.get("umask")
    mask = os.umask(umask if isinstance(umask, int) and 0 <= umask <= 0o777 else 0o077)  # -o FILE gets the client's mode
    try:
        os.chdir(request["cwd"])
        return main(request["argv"])
    except SystemExit as exc:  # argparse's usage errors (exit 2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 1
    except OSError as exc:
        print(f"kem: cannot run in {request['cwd']}: {exc.strerror}", file=sys.stderr)
        return 1
    except Exception:  # a bug: its traceback in this process's log, one line for the command
        # Not log.exception: the handler writes to the current sys.stderr,
        # which is the client's here (the client got the whole traceback
        # and the log nothing, red team).
        print(f"kem: warm command {request['argv']!r} failed:", file=sys.__stderr__)
        traceback.print_exc(file=sys.__stderr__)
        sys.__stderr__.flush()
        print("kem: internal error in the warm process (its log has the details)", file=sys.stderr)
        return 1
    finally:
        for stream in streams[1:]:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stdin, sys.stdout, sys.stderr = saved
        os.umask(mask)
        os.chdir("/")


def _stream(fd: int, mode: str) -> io.TextIOWrapper:
    """A text stream on the client's fd, as Python opens its own standard streams."""
    raw = open(fd, mode + "b", buffering=0, closefd=False)
    buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace" if mode == "w" else "strict",
                            line_buffering=mode == "w" and raw.isatty())
