"""``kem run --warm``'s side: find the warm process for this user and these
settings (or start it), hand it the command and the three standard streams,
and return its exit code.

One process per key: the kem version, the Python executable, kem_port's
directory, every ``KEM_*`` variable and the other variables that change a
command (KEY_PREFIXES, KEY_NAMES), and the newest modification time of kem_port's sources
(an edited checkout gets a fresh process, never yesterday's code). The
socket lives in the runtime directory the port uses (mode 0700, ours:
port/runtime_dir.py), and the server checks the peer's uid as well.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from kem_port.cli.console import CliError, Console
from kem_port.port import runtime_dir

PREFIX = "kem-warm-"
HEADER = struct.Struct("!I")  # the request's JSON length
MAX_REQUEST = 8 << 20  # bytes of argv and cwd as JSON (a --hex input rides in argv)
START_TIMEOUT_S = 60.0  # a cold start measured 4-6 s on the loaded 2-core dev machine; generous
STREAMS = (0, 1, 2)


# The environment a command's result depends on besides KEM_*: the warm
# process keeps the environment of the command that started it, so a
# variable missing from the key would let one shell's value serve another's
# commands. XDG_CACHE_HOME and HOME place the kernel cache (config.py's
# cache_dir default); VK_*, MESA_*, LP_* and WGPU_* choose the Vulkan
# driver, adapter and lavapipe's threads; PYTHONPATH which kem_port and
# wgpu are imported.
KEY_PREFIXES = ("KEM_", "VK_", "MESA_", "LP_", "WGPU_")
KEY_NAMES = ("HOME", "XDG_CACHE_HOME", "PYTHONPATH", "LD_LIBRARY_PATH")


def key() -> str:
    """What the warm process must share with this command to run it."""
    import kem_port

    package = Path(kem_port.__file__).resolve().parent
    newest = max(p.stat().st_mtime_ns for p in package.rglob("*.py"))
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(KEY_PREFIXES) or k in KEY_NAMES)
    blob = json.dumps([kem_port.__version__, sys.executable, str(package), env, newest, os.getuid()])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def socket_path() -> Path:
    return Path(runtime_dir.ensure()) / f"{PREFIX}{key()}.sock"


def forward(argv: list[str], console: Console) -> int:
    """Run ``kem`` argv in the warm process (starting it if none answers); its exit code."""
    path = socket_path()
    sock = connect(path) or _start(path)
    with sock:
        code, pid = _ask(sock, {"argv": argv, "cwd": os.getcwd(), "umask": _umask()})
    console.detail(f"served by the warm process {pid}")
    return code


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:  # none there, or a stale socket of one that ended: the server replaces it
        sock.close()
        return None
    return sock


def _start(path: Path) -> socket.socket:
    log = path.with_suffix(".log")
    with open(log, "ab") as err:
        # Its own session: the terminal's Ctrl-C for this command does not end it.
        proc = subprocess.Popen([sys.executable, "-m", "kem_port.warm", str(path)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        sock = connect(path)
        if sock is not None:
            return sock
        if proc.poll() not in (None, 0):  # 0: another command's start won the lock; wait for it
            break
        time.sleep(0.05)
    raise CliError(f"the warm kem process did not start (its log: {log}); run without --warm")


def _ask(sock: socket.socket, request: dict) -> tuple[int, int]:
    body = json.dumps(request).encode()
    if len(body) > MAX_REQUEST:
        raise CliError(f"the command is over {MAX_REQUEST} bytes for --warm; run it without --warm")
    socket.send_fds(sock, [HEADER.pack(len(body)) + body], list(STREAMS))
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise CliError("the warm kem process ended during the command; run it again without --warm")
        reply += chunk
    answer = json.loads(reply)
    return int(answer["code"]), int(answer["pid"])
