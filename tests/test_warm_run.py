"""`kem run --warm`: the second run of a kernel is served by the warm
process, skipping the device open, the admission and the compile (seen in
what it says with -v and in which process answered), and gives the same
bytes as numpy; another text is admitted and compiled anew; another
setting gets another process. Real `kem` processes, real wgpu."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = """@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i] * MUL + 3u;
}
"""


def kem(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kem_port.cli", *args], capture_output=True, cwd=cwd, env=env, timeout=120)


def served_by(done: subprocess.CompletedProcess) -> int:
    """The warm process that ran the command (-v says so)."""
    found = re.search(rb"served by the warm process (\d+)", done.stderr)
    assert found, done.stderr
    return int(found.group(1))


@pytest.fixture
def env(tmp_path):
    """Settings of this test only (KEM_KERNEL_DIR is part of the warm process's key); its warm processes are ended after."""
    env = {**os.environ, "KEM_KERNEL_DIR": str(tmp_path / "kernels"), "PYTHONPATH": str(ROOT)}
    yield env
    mark = f"KEM_KERNEL_DIR={env['KEM_KERNEL_DIR']}".encode()
    for proc in Path("/proc").iterdir():
        try:
            if b"kem_port.warm" in (proc / "cmdline").read_bytes() and mark in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def warm_run(tmp_path: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    done = kem("-v", "run", *args, "--warm", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    return done, served_by(done)


def test_the_second_warm_run_skips_the_device_admission_and_compile_and_gives_numpys_bytes(tmp_path, env, rng):
    kernel = tmp_path / "mul.wgsl"
    kernel.write_text(KERNEL.replace("MUL", "5u"))
    first, pid = warm_run(tmp_path, env, "mul.wgsl", "--hex", "01000000", "-o", "out.bin")
    assert pid != os.getpid() and b"kem: compiling mul" in first.stderr  # admitted (the sacrificial compile) and compiled there
    for words in (int(rng.integers(1, 64)), int(rng.integers(64, 4096))):
        seed = int(rng.integers(0, 1 << 31))
        args = ("mul.wgsl", "--random", str(words * 4), "--seed", str(seed), "-o", "out.bin")
        done, served = warm_run(tmp_path, env, *args)
        if served != pid:  # kem_port's sources changed meanwhile (a shared tree): a new process, warm from now on
            done, pid = warm_run(tmp_path, env, *args)[0], served
            assert served_by(done) == pid
        said = done.stderr.decode()
        assert "kem: compiling mul" not in said  # its pipeline was there: no admission, no compile
        assert "device open" not in said  # and no device opened for it
        x = np.frombuffer(np.random.default_rng(seed).bytes(words * 4), "<u4")
        assert (tmp_path / "out.bin").read_bytes() == (x * np.uint32(5) + np.uint32(3)).astype("<u4").tobytes()
    # Another text is another kernel: admitted and compiled anew.
    kernel.write_text(KERNEL.replace("MUL", "7u"))
    done, _ = warm_run(tmp_path, env, "mul.wgsl", "--hex", "01000000", "-o", "out.bin")
    assert "kem: compiling mul" in done.stderr.decode()
    assert (tmp_path / "out.bin").read_bytes() == (1 * 7 + 3).to_bytes(4, "little")


def test_a_warm_run_speaks_as_a_cold_one_on_errors_and_pipes(tmp_path, env):
    (tmp_path / "bad.wgsl").write_text(KERNEL.replace("MUL", "nope"))
    cold = kem("run", "bad.wgsl", "--hex", "01000000", cwd=tmp_path, env=env)
    warm = kem("run", "bad.wgsl", "--hex", "01000000", "--warm", cwd=tmp_path, env=env)
    assert cold.returncode == warm.returncode == 1
    assert warm.stderr == cold.stderr and b"nope" in warm.stderr
    usage = kem("run", "bad.wgsl", "--warm", cwd=tmp_path, env=env)  # no input: argparse's exit 2
    assert usage.returncode == 2 and b"give an input" in usage.stderr
    (tmp_path / "ok.wgsl").write_text(KERNEL.replace("MUL", "2u"))
    piped = kem("run", "ok.wgsl", "--hex", "0100000002000000", "--warm", cwd=tmp_path, env=env)  # stdout a pipe: raw bytes
    assert piped.returncode == 0 and piped.stdout == bytes.fromhex("0500000007000000")


def test_other_settings_get_another_warm_process(env):
    code = "from kem_port.warm.client import key; print(key())"
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**env, **extra}).stdout for extra in ({}, {"KEM_ZERO_WORKGROUP": "on"}, {"KEM_LOG": "INFO"})}
    assert len(keys) == 3


def test_a_warm_check_reports_as_a_cold_one(tmp_path, env):
    (tmp_path / "ok.wgsl").write_text(KERNEL.replace("MUL", "2u"))
    (tmp_path / "bad.wgsl").write_text(KERNEL.replace("MUL", "nope"))
    for name, code in (("ok.wgsl", 0), ("bad.wgsl", 1)):
        cold = kem("check", name, "--json", cwd=tmp_path, env=env)
        warm = kem("check", name, "--json", "--warm", cwd=tmp_path, env=env)
        assert cold.returncode == warm.returncode == code
        assert json.loads(warm.stdout) == json.loads(cold.stdout)


def test_the_warm_process_ends_when_idle_and_takes_its_socket_with_it(tmp_path, env):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    sock = folder / "kem-warm-test.sock"
    proc = subprocess.Popen([sys.executable, "-m", "kem_port.warm", str(sock), "2"], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        assert sock.exists()
        assert proc.wait(timeout=30) == 0  # two idle seconds, then gone
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_warm_process_killed_outright_is_replaced_on_the_next_run(tmp_path, env):
    (tmp_path / "ok.wgsl").write_text(KERNEL.replace("MUL", "2u"))
    _, pid = warm_run(tmp_path, env, "ok.wgsl", "--hex", "01000000", "-o", "out.bin")
    os.kill(pid, signal.SIGKILL)  # its socket file stays behind, answering nobody
    done, again = warm_run(tmp_path, env, "ok.wgsl", "--hex", "02000000", "-o", "out.bin")
    assert again != pid and (tmp_path / "out.bin").read_bytes() == (2 * 2 + 3).to_bytes(4, "little")


def test_a_warm_runs_output_file_gets_the_callers_umask(tmp_path, env):
    (tmp_path / "ok.wgsl").write_text(KERNEL.replace("MUL", "2u"))
    for mask, mode in ((0o022, 0o644), (0o077, 0o600)):
        (tmp_path / "out.bin").unlink(missing_ok=True)
        done = subprocess.run(["sh", "-c", f"umask {mask:03o} && exec \"$0\" -m kem_port.cli run ok.wgsl --hex 01000000 -o out.bin --warm",
                               sys.executable], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "out.bin").stat().st_mode & 0o777 == mode
