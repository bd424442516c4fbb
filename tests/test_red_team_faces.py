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
