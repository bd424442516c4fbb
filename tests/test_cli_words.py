"""The commands speak their user's words (issue 26): ``kem``'s one-line
errors keep a validation error's cause and line:column and name flags, not
the port's Erlang option maps or the decoder's Python types; ``kem-port``
at a terminal prints a usage text, not binary frames. Each test runs the
real console script (or ``python -m``) as a user would."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import cli_env, kem
from test_named_buffers import KERNELS

# A validation error (not a parse error): naga puts the cause in "= ..."
# notes and the place as "┌─ :5:23", without the "wgsl" a parse error has.
ABSTRACT_FLOAT = """@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    b[g.x] = a[g.x] + 1.5;
}
"""
DEBUG_CHANNEL = """struct KemDebug { count: atomic<u32>, records: array<u32> }
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@group(0) @binding(15) var<storage, read_write> kem_debug: KemDebug;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&b)) { b[g.x] = a[g.x]; atomicAdd(&kem_debug.count, 1u); }
}
"""
# What the port says to Erlang callers and the command must not repeat.
ERLANG_OR_PYTHON = re.compile(r"=>|#\{|OtpErlang|\(atoms? or binar")


def error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_run_keeps_a_validation_errors_cause_and_place(tmp_path):
    """BEFORE: "kem: shader_error: Shader validation error: Entry point main
    at Compute is invalid (kem check FILE shows ...)": no cause, no place."""
    (tmp_path / "abstract.wgsl").write_text(ABSTRACT_FLOAT)
    line = error_line(kem(tmp_path, "run", str(tmp_path / "abstract.wgsl"), "--random", "64"))
    assert line.startswith("kem: shader_error: "), line
    assert "Abstract types may only appear in constant expressions" in line, line
    assert "at line 5, column 23" in line, line


def test_run_keeps_a_parse_errors_place_without_an_empty_shader_name(tmp_path):
    (tmp_path / "parse.wgsl").write_text("@compute @workgroup_size(64)\nfn main() {\n  let x = ;\n}\n")
    line = error_line(kem(tmp_path, "run", str(tmp_path / "parse.wgsl"), "--random", "64"))
    assert "expected expression" in line and "at line 3, column 11" in line, line
    assert "Shader ''" not in line, line


@pytest.mark.parametrize(
    "case, flag",
    [
        # BEFORE: "... not OtpErlangBinary(b'1x',bits=8)"
        ("constant_name", "--constant names must be WGSL identifiers, not '1x'"),
        # BEFORE: "... call with debug => true, or remove it"
        ("debug_channel", "run with --debug"),
        # BEFORE: "... gives its dispatch: grid => {X, Y, Z} (invocations) or workgroups"
        ("named_dispatch", "--grid X,Y,Z (invocations) or --workgroups"),
        # BEFORE: "... needs a size: outputs => #{c => Bytes}, or its bytes"
        ("named_output", "--out c=BYTES, or --buffer c=@FILE"),
        # BEFORE: "entry_point must be a WGSL identifier (atom or binary)"
        ("entry_point", "--entry-point must be a WGSL identifier"),
    ],
)
def test_errors_name_the_commands_flags_in_plain_words(tmp_path, case, flag):
    (tmp_path / "add.wgsl").write_text(KERNELS["add"])
    (tmp_path / "debug.wgsl").write_text(DEBUG_CHANNEL)
    add, named = str(tmp_path / "add.wgsl"), ["--buffer", "a=random:16", "--buffer", "b=random:16"]
    args = {
        "constant_name": ["double", "--random", "16", "--constant", "1x=2"],
        "debug_channel": [str(tmp_path / "debug.wgsl"), "--random", "64"],
        "named_dispatch": [add, *named, "--out", "c=16"],
        "named_output": [add, *named, "--grid", "4"],
        "entry_point": ["double", "--random", "16", "--entry-point", "a b"],
    }[case]
    line = error_line(kem(tmp_path, "run", *args))
    assert flag in line, line
    assert not ERLANG_OR_PYTHON.search(line), line


@pytest.mark.parametrize("extra, flags", [(["--debug"], "--debug"), (["--params", "4", "--hint", "2"], "--params, --hint")])
def test_plain_call_options_by_named_buffers_are_refused_not_ignored(tmp_path, extra, flags):
    """BEFORE: --debug (and --params, --hint...) by named buffers were
    ignored: the run went on without them and exited 0."""
    (tmp_path / "add.wgsl").write_text(KERNELS["add"])
    done = kem(tmp_path, "run", str(tmp_path / "add.wgsl"), "--buffer", "a=random:16", "--buffer", "b=random:16",
               "--out", "c=16", "--grid", "4", "-o", str(tmp_path / "c.bin"), *extra)
    assert done.returncode == 2, done
    assert f"kem run: error: {flags}: only for a call with --input/--hex/--random" in done.stderr.decode()
    assert not (tmp_path / "c.bin").exists()


def test_cli_words_maps_each_erlang_phrase():
    """The mapping itself, on the port's phrasings that have no easy road
    from the command (an unknown option key arrives as an atom)."""
    import erlang

    from kem_port.cli.console import cli_words
    from kem_port.errors import KemError
    from kem_port.wire import protocol

    with pytest.raises(KemError) as unknown:  # the port's own detail for an atom key (wire/terms.shown)
        protocol.options({erlang.OtpErlangAtom(b"outptu"): 1}, ("x",), "Opts", "option")
    assert cli_words(unknown.value.detail) == "unknown option 'outptu'; known: x"
    assert cli_words("give grid (invocations) or workgroups, not both") == "give --grid (invocations) or --workgroups, not both"
    assert cli_words("give output_size or output_size_hint, not both") == "give --output-size or --hint, not both"
    assert cli_words("pass constants => #{n => Value}") == "pass --constant n=VALUE"
    assert cli_words("takes neither params nor workgroups nor grid") == "takes neither --params nor --workgroups nor --grid"
    assert cli_words("grid must each be >= 1") == "--grid must each be >= 1"
    # Words that are not option names stay as they are.
    assert cli_words("the grid rule sized 12 workgroups") == "the grid rule sized 12 workgroups"


def kem_port_script() -> str:
    script = Path(sys.executable).with_name("kem-port")
    assert script.exists(), f"the kem-port console script is not installed beside {sys.executable}"
    return str(script)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_kem_port_help_prints_usage_and_exits_0(tmp_path, flag):
    """BEFORE: --help was ignored; the port started and wrote frames."""
    done = subprocess.run([kem_port_script(), flag], capture_output=True, stdin=subprocess.DEVNULL,
                          env=cli_env(tmp_path), timeout=60)
    assert done.returncode == 0, done
    text = done.stdout.decode("ascii")
    assert text.startswith("usage: kem-port") and "kem run" in text, text
    assert "\0" not in text


def test_kem_port_at_a_terminal_prints_usage_not_frames(tmp_path):
    """stdin and stdout on a pty, as when a person types ``kem-port``: usage
    on the terminal, exit 2, and no frame (a frame starts with 4 length
    bytes and then ETF's 131; a log frame would hold NULs)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([kem_port_script()], stdin=follower, stdout=follower, stderr=follower, env=cli_env(tmp_path))
    os.close(follower)
    shown, deadline = b"", time.monotonic() + 60
    # Bounded: before the mend the port sat at the terminal waiting for frames.
    while time.monotonic() < deadline:
        if not select.select([leader], [], [], 1.0)[0]:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the pty
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    try:
        code = proc.wait(10)  # the pty's EIO can come a moment before the exit
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"kem-port at a terminal did not exit; it showed {shown[:200]!r}")
    assert code == 2
    text = shown.decode("ascii")
    assert "usage: kem-port" in text and "not meant to be run by hand" in text, text
    assert all(c.isprintable() or c in "\r\n" for c in text), repr(text)


def test_kem_port_with_pipes_still_serves(tmp_path):
    """The node's case is untouched: pipes on both ends, no arguments."""
    from kem_port.client import PortClient

    with PortClient(script=kem_port_script(), python=sys.executable) as client:
        assert client.call_plain("ping") == "pong"
