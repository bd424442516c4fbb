"""The README's dependency line, as a node operator uses it.

A throwaway rebar3 project in a temp dir depends on this repository by a
``file://`` git URL through ``git_subdir`` (rebar3 keeps only
``erlang/kem`` on disk). Started as is, kem says in one error which
interpreters it tried and how to fix it; ``kem_python:install/0`` then pip
installs kem_port from the dependency's own git commit into kem's venv, and kem starts and runs a kernel, checked against numpy.

The repository is a fresh commit of this working tree (tracked and untracked,
not ignored files), so uncommitted work is what gets tested.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=kem-test", "-c", "user.email=kem-test@localhost", "-c", "init.defaultBranch=main"]


def snapshot_repo(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    subprocess.run([*GIT, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "snapshot"], cwd=dest, check=True)
    return dest


def clean_env(home: Path) -> dict[str, str]:
    """No venv on PATH, no KEM_* settings, a HOME of its own."""
    tools = {str(Path(shutil.which(t)).parent) for t in ("erl", "rebar3", "git")}
    path = ":".join([*sorted(tools), "/usr/bin", "/bin"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEM_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(PATH=path, HOME=str(home))
    return env


@pytest.mark.skipif(shutil.which("rebar3") is None or shutil.which("erl") is None, reason="no rebar3/erl")
def test_git_subdir_dependency_builds_finds_its_python_half_and_runs(tmp_path: Path) -> None:
    repo = snapshot_repo(tmp_path / "kem")
    url = f"file://{repo}"
    project = tmp_path / "node"
    (project / "src").mkdir(parents=True)
    (project / "rebar.config").write_text(
        f'{{deps, [{{kem, {{git_subdir, "{url}", {{branch, "main"}}, "erlang/kem"}}}}]}}.\n'
    )
    (project / "src" / "node.app.src").write_text(
        '{application, node, [{vsn, "0.1.0"}, {applications, [kernel, stdlib, kem]}]}.\n'
    )
    env = clean_env(tmp_path / "home")
    build = subprocess.run(["rebar3", "compile"], cwd=project, env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr

    dep = project / "_build" / "default" / "lib" / "kem"
    # What git_subdir keeps: a sparse checkout of erlang/kem (the app is
    # built there) and the whole commit in .git, but no Python file on disk.
    assert (dep / "erlang" / "kem" / "ebin" / "kem.app").is_file()
    assert not [p for p in dep.rglob("*.py") if ".git" not in p.parts]
    ebins = sorted({str(p.parent) for p in (project / "_build").rglob("ebin/*.app")})

    venv = tmp_path / "kem-venv"
    data = np.random.default_rng().integers(0, 2**32, size=257, dtype="<u4")
    script = f"""
        application:load(kem),
        application:set_env(kem, venv, "{venv}"),
        Out = fun(K, V) -> io:format("KEM-TEST ~s~n", [kem_json:encode(#{{K => V}})]) end,
        {{error, {{kem, {{{{python_not_found, Why}}, _}}}}}} = application:ensure_all_started(kem),
        Out(<<"why">>, Why),
        Out(<<"install">>, iolist_to_binary(io_lib:format("~0p", [kem_python:install()]))),
        {{ok, _}} = application:ensure_all_started(kem),
        Out(<<"python">>, list_to_binary(kem_port:python_executable())),
        {{ok, Bin}} = kem:execute(<<"double">>, binary:decode_hex(<<"{data.tobytes().hex()}">>), #{{}}),
        Out(<<"result">>, binary:encode_hex(Bin)),
        %% The dashboard's page is in priv: shipped with the dependency.
        {{ok, <<"<!DOCTYPE html>", _/binary>>}} = kem:dashboard(),
        Out(<<"dashboard">>, <<"ok">>),
        halt().
    """
    run = subprocess.run(
        ["erl", "-noshell", "-pa", *ebins, "-eval", script],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    lines = {}
    for line in run.stdout.splitlines():
        if line.startswith("KEM-TEST "):
            lines.update(json.loads(line.removeprefix("KEM-TEST ")))
    assert "result" in lines, run.stdout + run.stderr

    # One error that names what it tried and the fix.
    assert "python3 on PATH /usr/bin/python3" in lines["why"]
    assert "kem_python:install" in lines["why"]
    assert lines["install"] == "ok"
    assert lines["python"] == str(venv / "bin" / "python")
    out = np.frombuffer(bytes.fromhex(lines["result"]), dtype="<u4")
    np.testing.assert_array_equal(out, data * np.uint32(2))
    assert lines.get("dashboard") == "ok", run.stdout + run.stderr
