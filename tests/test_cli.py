"""The ``kem`` command through real subprocesses on the real adapter:
outputs against numpy on fresh random inputs, the terminal/pipe split,
check and adapters reports, and exit codes."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import reference
from cli_helpers import cli_env, kem

KERNELS = Path(__file__).parents[1] / "kem_port" / "kernels"
READ_ONLY_OUTPUT = """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) { }
"""
SYNTAX_ERROR = """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    b[g.x] = a[g.x] +;
}
"""


def one_line(stderr: bytes) -> str:
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("size", [1, 1000, 70_001])
def test_run_file_to_file_matches_numpy(tmp_path, rng, size):
    data = rng.bytes(size)
    (tmp_path / "in.bin").write_bytes(data)
    done = kem(tmp_path, "run", "double", "--input", str(tmp_path / "in.bin"), "--hint", "2", "-o", str(tmp_path / "out.bin"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b""
    assert (tmp_path / "out.bin").read_bytes() == reference.double(data, 2 * size)


def test_run_wgsl_file_from_stdin_to_pipe(tmp_path, rng):
    words = rng.integers(0, 2**32, size=513, dtype=np.uint32)
    done = kem(tmp_path, "run", str(KERNELS / "double.wgsl"), "--input", "-", stdin=words.tobytes())
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.frombuffer(done.stdout, dtype=np.uint32), words * np.uint32(2))


def test_run_hex_and_seeded_random(tmp_path):
    done = kem(tmp_path, "run", "double", "--hex", "01000000 ff000000", "--output-size", "12")
    assert done.returncode == 0, done.stderr
    assert done.stdout == bytes.fromhex("02000000 fe010000 00000000")
    seeded = kem(tmp_path, "-v", "run", "double", "--random", "4K", "--seed", "7")
    assert seeded.returncode == 0, seeded.stderr
    said = seeded.stderr.decode()
    for stage in ("device open", "compile", "run"):
        assert re.search(rf"^kem: {stage}: \d+\.\d ms$", said, re.M), said
    expected = np.random.default_rng(7).bytes(4096)
    assert seeded.stdout == reference.double(expected, 4096)


def test_run_png_in_png_out_matches_numpy(tmp_path, rng):
    w, h, seed, strength = 37, 29, int(rng.integers(0, 2**31)), 9
    image = rng.integers(0, 256, size=(h, w, 4), dtype=np.uint8)
    Image.fromarray(image, "RGBA").save(tmp_path / "in.png")
    done = kem(
        tmp_path, "run", "glitch", "--input", str(tmp_path / "in.png"),
        "--params", f"w,h,{seed},{strength}", "--png", "-o", str(tmp_path / "out.png"),
    )
    assert done.returncode == 0, done.stderr
    with Image.open(tmp_path / "out.png") as out:
        assert out.size == (w, h)
        got = np.asarray(out.convert("RGBA"))
    np.testing.assert_array_equal(got, reference.glitch(image, seed, strength))


def test_run_params_words_and_workgroups(tmp_path, rng):
    w, h, p = 40, 24, 5
    image = rng.integers(0, 256, size=(h, w, 4), dtype=np.uint8)
    (tmp_path / "img.rgba").write_bytes(image.tobytes())
    done = kem(
        tmp_path, "run", "pixelize", "--input", str(tmp_path / "img.rgba"),
        "--params", f"{w},{h},0x{p:x},0", "--workgroups", f"{-(-w // 16)},{-(-h // 16)},1",
    )
    assert done.returncode == 0, done.stderr
    got = np.frombuffer(done.stdout, dtype=np.uint8).reshape(h, w, 4)
    np.testing.assert_array_equal(got, reference.pixelize(image, p))


def test_terminal_gets_a_hex_dump_not_bytes(tmp_path):
    """stdout on a pty: a hex dump of the bytes, nothing unprintable."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kem_port.cli", "run", "double", "--hex", "41424300" * 2 + "00ff7f01"],
        stdout=follower, stderr=subprocess.PIPE, env=cli_env(tmp_path),
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the pty
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert proc.wait(60) == 0, proc.stderr.read()
    text = shown.decode("ascii")
    assert all(c.isprintable() or c in "\r\n" for c in text), text
    expected = reference.double(bytes.fromhex("41424300" * 2 + "00ff7f01"), 12)
    assert text.startswith("00000000  " + " ".join(f"{b:02x}" for b in expected) + " "), text


def test_terminal_dump_is_bounded(tmp_path):
    from kem_port.cli.output import hex_dump

    dump = hex_dump(bytes(range(256)) * 40, limit=64)
    assert dump.count("\n") == 5 and "10176 more bytes" in dump


def test_check_reports_bindings_and_dispatch(tmp_path):
    done = kem(tmp_path, "check", str(KERNELS / "double.wgsl"), "--input-size", "100M", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    # 26,214,400 words / 256 a group = 102,400 groups: over 65,535 in x, spilled into y.
    assert report["dispatch"] == [65535, 2, 1]
    assert [(b["binding"], b["role"]) for b in report["bindings"]] == [(0, "input"), (1, "output")]
    image = kem(tmp_path, "check", str(KERNELS / "glitch.wgsl"), "--params", "640,480,1,2", "--input-size", str(640 * 480 * 4))
    assert image.returncode == 0, image.stderr
    assert "dispatch  (40, 30, 1) workgroups" in image.stdout.decode()


def test_check_names_what_is_wrong(tmp_path):
    (tmp_path / "ro.wgsl").write_text(READ_ONLY_OUTPUT)
    contract = kem(tmp_path, "check", str(tmp_path / "ro.wgsl"))
    assert contract.returncode == 1
    assert "binding 1 must be the output: var<storage, read_write>" in contract.stderr.decode()
    (tmp_path / "syntax.wgsl").write_text(SYNTAX_ERROR)
    syntax = kem(tmp_path, "check", str(tmp_path / "syntax.wgsl"))
    assert syntax.returncode == 1
    assert re.search(r"syntax:6:\d+", syntax.stderr.decode()), syntax.stderr  # naga's line:column, naming the kernel
    ran = kem(tmp_path, "run", str(tmp_path / "syntax.wgsl"), "--hex", "00")
    assert ran.returncode == 1
    assert re.fullmatch(r"kem: shader_error: .* at line 6, column \d+ .*", one_line(ran.stderr))


def test_adapters_lists_and_picks(tmp_path):
    done = kem(tmp_path, "adapters", "--json")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    indexes = [a["index"] for a in listing["adapters"]]
    assert listing["kem_picks"] in indexes
    assert all(a["limits"]["max-compute-workgroups-per-dimension"] >= 65535 for a in listing["adapters"])
    by_index = kem(tmp_path, "adapters", env=cli_env(tmp_path, KEM_ADAPTER=str(indexes[-1])))
    assert by_index.returncode == 0
    assert f"kem picks: {indexes[-1]} (KEM_ADAPTER=" in by_index.stdout.decode()
    missing = kem(tmp_path, "adapters", env=cli_env(tmp_path, KEM_ADAPTER="no-such-gpu"))
    assert missing.returncode == 1
    assert "no_adapter" in missing.stderr.decode()


def test_adapters_without_a_usable_adapter_answers_cleanly(tmp_path):
    # A backend this machine lacks: wgpu's request_adapter raises then, as on
    # a host with no driver. The node reads --json (kem_adapters): a listing
    # with no pick and why, exit 0, never a traceback on its console.
    env = cli_env(tmp_path, WGPU_BACKEND_TYPE="Metal")
    done = kem(tmp_path, "adapters", "--json", env=env)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["kem_picks"] is None
    assert listing["why"].startswith("no_adapter: ")
    assert b"Traceback" not in done.stderr
    human = kem(tmp_path, "adapters", env=env)
    assert human.returncode == 1
    assert b"Traceback" not in human.stderr
    assert "kem: kem would find no adapter: no_adapter: " in human.stderr.decode()


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["run", "no_such_kernel", "--hex", "00"], 1, "kem: kernel_not_found: no kernel 'no_such_kernel'"),
        (["run", "double", "--hex", "00", "--output-size", "0x"], 2, "not a size"),
        (["run", "double"], 2, "give an input (--input, --hex or --random), or buffers by name"),
        (["run", "double", "--hex", "00", "--out", "c=4"], 2, "or the buffers by name (--buffer/--out), not both"),
        (["run", "double", "--hex", "00", "--params", "1,2"], 1, "kem: bad_args: params given, but the kernel declares no @binding(2)"),
        (["run", "glitch", "--hex", "00", "--params", "w,h"], 1, "kem: --params uses 'w', which needs a PNG --input"),
        (["run", "double", "--input", "/nonexistent/x"], 1, "kem: cannot read /nonexistent/x"),
        (["frobnicate"], 2, "invalid choice"),
        (["run", "double", "--random", "64G"], 1, "kem: too_large: --random is over KEM_MAX_INPUT_BYTES"),
    ],
)
def test_exit_codes(tmp_path, args, code, message):
    done = kem(tmp_path, *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr.decode()
    if code == 1:
        one_line(done.stderr)


def test_input_limits_and_settings(tmp_path):
    (tmp_path / "in.bin").write_bytes(bytes(4096))
    small = cli_env(tmp_path, KEM_MAX_INPUT_BYTES="1024")
    done = kem(tmp_path, "run", "double", "--input", str(tmp_path / "in.bin"), env=small)
    assert done.returncode == 1
    assert one_line(done.stderr) == f"kem: too_large: {tmp_path / 'in.bin'} is over KEM_MAX_INPUT_BYTES=1024 (4096 bytes)"
    piped = kem(tmp_path, "run", "double", "--input", "-", env=small, stdin=bytes(2048))
    assert piped.returncode == 1 and b"too_large" in piped.stderr
    bad_log = kem(tmp_path, "run", "double", "--hex", "00", env=cli_env(tmp_path, KEM_LOG="verbose"))
    assert bad_log.returncode == 1
    assert one_line(bad_log.stderr) == "kem: KEM_LOG='verbose' is not a log level (DEBUG, INFO, WARNING, ERROR)"


@pytest.mark.parametrize("command", [[], ["run"], ["check"], ["adapters"], ["publish"], ["keygen"]])
def test_help_everywhere(tmp_path, command):
    done = kem(tmp_path, *command, "--help")
    assert done.returncode == 0
    assert b"usage: kem" in done.stdout


def test_console_script_installed(tmp_path):
    script = Path(sys.executable).parent / "kem"
    if not script.exists():
        pytest.skip("the venv predates the kem console script (pip install -e . adds it)")
    done = subprocess.run([str(script), "run", "double", "--hex", "03000000"], capture_output=True, env=cli_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == bytes.fromhex("06000000")


# -- hostile kernels (issue 24, item 7) ----------------------------------------
# The CLI compiled in its own process without the admission guard: `kem
# check` and `kem run` died by SIGSEGV on 3,000 nested parentheses (naga off
# the end of its stack) and grew without end on a 200 MB private array,
# kernels the port refuses. Now both take the port's road: structural
# limits, then the sacrificial compile worker under its limits.
GUARD_ENV = {"KEM_COMPILE_TIMEOUT_MS": "4000", "KEM_COMPILE_MEMORY_MB": "512"}


def hostile_kernel(tmp_path: Path, name: str) -> Path:
    from test_compile_guard import ATTACKS

    path = tmp_path / f"{name}.wgsl"
    path.write_text(ATTACKS[name])
    return path


@pytest.mark.parametrize("name", ["parens", "private_array_const"])
def test_check_refuses_a_hostile_kernel_with_a_reason_not_a_signal(tmp_path, name):
    path = hostile_kernel(tmp_path, name)
    done = kem(tmp_path, "check", str(path), env=cli_env(tmp_path, **GUARD_ENV))
    assert done.returncode == 1, (done.returncode, done.stderr[-400:])
    said = done.stderr.decode()
    assert "Traceback" not in said
    assert said.strip().splitlines()[-1] == f"kem: {path}: not a valid kem kernel: kernel_rejected"
    as_json = kem(tmp_path, "check", str(path), "--json", env=cli_env(tmp_path, **GUARD_ENV))
    assert as_json.returncode == 1, as_json.stderr[-400:]
    report = json.loads(as_json.stdout)
    assert (report["ok"], report["reason"]) == (False, "kernel_rejected")
    assert str(tmp_path) not in report["error"] and "\n" not in report["error"]


@pytest.mark.parametrize("name", ["parens", "private_array_const"])
def test_run_refuses_a_hostile_kernel_in_one_line(tmp_path, name):
    path = hostile_kernel(tmp_path, name)
    done = kem(tmp_path, "run", str(path), "--random", "4K", env=cli_env(tmp_path, **GUARD_ENV))
    assert done.returncode == 1, (done.returncode, done.stderr[-400:])
    assert done.stdout == b""
    assert one_line(done.stderr).startswith("kem: kernel_rejected: kernel ")


def test_a_kernel_of_ones_own_still_checks_and_runs_through_the_guard(tmp_path, rng):
    from test_compile_guard import TRIPLE

    path = tmp_path / "triple.wgsl"
    path.write_text(TRIPLE)
    checked = kem(tmp_path, "check", str(path), "--json", env=cli_env(tmp_path, **GUARD_ENV))
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["ok"] is True
    for size in (1, 1000, 70_001):
        words = rng.integers(0, 2**32, size=size, dtype=np.uint32)
        done = kem(tmp_path, "run", str(path), "--input", "-", stdin=words.tobytes(), env=cli_env(tmp_path, **GUARD_ENV))
        assert done.returncode == 0, done.stderr
        np.testing.assert_array_equal(np.frombuffer(done.stdout, dtype=np.uint32), words * np.uint32(3))
