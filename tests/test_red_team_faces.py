"""Red team of the faces that landed in one wave (the warm process, the
playground, the dashboard, the Python API): each test is an attack that
worked on the code before its fix, run against the real parts (real files
and sockets, a real HTTP server on a real port, real wgpu on lavapipe).
"""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from kem_port.port import runtime_dir

NOBODY = 65534  # another user's uid, for files this (root) test plants as them


def test_planted_runtime_dir_symlink_is_not_used(tmp_path, monkeypatch):
    """Another user plants /tmp/kem-runtime-<uid> as a symlink to a 0700
    directory of ours (it passes stat's owner and mode checks); the link is
    theirs, so they can re-point it at their own directory between the check
    and the warm client's connect, and receive its argv and stdin/stdout/stderr.
    The shared name must be a real directory of ours, not a link."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ours = tmp_path / "ssh-like"
    ours.mkdir(mode=0o700)
    planted = tmp_path / f"kem-runtime-{os.getuid()}"
    planted.symlink_to(ours)
    if os.getuid() == 0:
        os.lchown(planted, NOBODY, NOBODY)  # as the stranger would own it
    env: dict[str, str] = {}
    chosen = runtime_dir.ensure(env)
    assert chosen != str(planted) and env["XDG_RUNTIME_DIR"] == chosen
    info = os.lstat(chosen)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert not os.path.realpath(chosen).startswith(str(ours))
    # A real directory of ours at the shared name is still reused.
    planted.unlink()
    planted.mkdir(mode=0o700)
    assert runtime_dir.ensure({}) == str(planted)


@pytest.mark.skipif(os.getuid() != 0, reason="planting another user's directory needs root")
def test_runtime_dir_planted_by_another_user_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"kem-runtime-{os.getuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    chosen = runtime_dir.ensure({})
    assert chosen != str(planted) and os.lstat(chosen).st_uid == os.getuid()


@pytest.mark.parametrize("name", ["XDG_CACHE_HOME", "HOME", "VK_ICD_FILENAMES", "WGPU_BACKEND_TYPE", "LP_NUM_THREADS"])
def test_warm_key_separates_environments_that_change_a_command(name, monkeypatch):
    """The warm process keeps the environment of the command that started
    it; a command from a shell whose kernel cache (XDG_CACHE_HOME, HOME) or
    Vulkan driver and adapter (VK_*, WGPU_*, lavapipe's LP_*) differ must not
    be served by it, so its key must differ."""
    from kem_port.warm import client

    monkeypatch.setenv(name, "/one")
    first = client.key()
    monkeypatch.setenv(name, "/two")
    assert client.key() != first
    monkeypatch.setenv(name, "/one")
    assert client.key() == first  # and the same shell finds its process again


def _start_warm(folder, env):
    import subprocess
    import sys
    import time

    sock = folder / "kem-warm-red.sock"
    proc = subprocess.Popen([sys.executable, "-m", "kem_port.warm", str(sock), "120"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while not sock.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    assert sock.exists()
    return proc, sock


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe\x00", b"[" * 100_000, b'{"argv": ["run"], "cwd": "/", "umask": "x"'])
def test_a_malformed_warm_request_does_not_end_the_warm_process(tmp_path, body):
    """A request the warm process cannot read (not JSON, not UTF-8, nested
    past the parser's recursion limit) is dropped; before, its exception
    left the accept loop and ended the process (every later --warm command
    paid a cold start again)."""
    import socket
    from pathlib import Path

    from kem_port.warm import client

    root = Path(__file__).resolve().parents[1]
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    (tmp_path / "ok.wgsl").write_text(
        "@group(0) @binding(0) var<storage, read> i: array<u32>;\n"
        "@group(0) @binding(1) var<storage, read_write> o: array<u32>;\n"
        "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
        "  if (g.x < arrayLength(&o)) { o[g.x] = i[g.x] * 3u + 1u; } }\n")
    env = {**os.environ, "PYTHONPATH": str(root), "KEM_KERNEL_DIR": str(tmp_path / "kernels")}
    proc, path = _start_warm(folder, env)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
            socket.send_fds(sock, [client.HEADER.pack(len(body)) + body], [0, 1, 2])
            sock.settimeout(60)
            assert sock.recv(100) == b""  # dropped, no answer
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        sock = client.connect(path)
        assert sock is not None
        with sock, open(tmp_path / "err.txt", "wb") as err:
            code, pid = _ask_with_stderr(sock, err, {"argv": ["run", "ok.wgsl", "--hex", "0500000007000000", "-o", "out.bin"],
                                                   "cwd": str(tmp_path), "umask": 0o077})
        assert (code, pid) == (0, proc.pid), (tmp_path / "err.txt").read_text()
        assert (tmp_path / "out.bin").read_bytes() == bytes.fromhex("1000000016000000")
    finally:
        proc.terminate()
        proc.wait(30)


def _ask_with_stderr(sock, err, request):
    """client._ask's exchange, with the command's stderr into a file we read."""
    import json
    import socket

    from kem_port.warm import client

    body = json.dumps(request).encode()
    socket.send_fds(sock, [client.HEADER.pack(len(body)) + body], [0, 1, err.fileno()])
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        assert chunk, "the warm process closed the connection"
        reply += chunk
    answer = json.loads(reply)
    return int(answer["code"]), int(answer["pid"])
