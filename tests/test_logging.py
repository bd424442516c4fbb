"""The port's one log pipeline, seen from a real port process: records as
log frames with metadata, native stderr captured, Mesa's runtime-dir notice
gone at its source, invalid levels refused at start; and health."""

from __future__ import annotations

import os
import stat
import time

import pytest

from kem_port.port import runtime_dir
from kem_port.wire import terms
from kem_port.client import PortClient, PortError
from kem_port.port.native_stderr import level_of


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_records_and_native_stderr_arrive_as_log_frames(monkeypatch):
    # No runtime dir (a node under a service manager): Mesa printed its
    # notice at every start.
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    env = {"KEM_TEST_HOOKS": "1", "KEM_LOG": "debug", "KEM_PORT_INDEX": "7"}
    with PortClient(env) as port:
        assert terms.atom_name(port.call("test_hook", terms.atom("stdout_noise"))) == "ok"
        wait_for(lambda: any(m == "noise written to fd 1" for _, _, m, _ in port.logs))
        logs = list(port.logs)
        pid = port.proc.pid
    noise = [entry for entry in logs if entry[2] in ("noise from print()", "noise written to fd 1")]
    assert [(level, logger) for level, logger, _, _ in noise] == [("info", "kem_port.native")] * 2
    assert all(meta["os_pid"] == pid and meta["port_index"] == 7 and meta["adapter"] for *_, meta in noise)
    # At debug, every line the drivers print travels: none is Mesa's notice.
    assert not [m for _, _, m, _ in logs if "XDG_RUNTIME_DIR" in m], logs


def test_invalid_log_level_is_a_start_error_not_a_traceback():
    port = PortClient({"KEM_LOG": "verbose"})
    with pytest.raises(PortError) as caught:
        port.call("ping", timeout=30)
    assert caught.value.reason == "bad_config"
    assert caught.value.detail == "kem_port: KEM_LOG='verbose' is not a log level (debug, info, warning, error, critical)"
    assert port.proc.wait(10) == 2


def test_runtime_dir_is_private_and_reused(tmp_path):
    env: dict[str, str] = {"XDG_RUNTIME_DIR": str(tmp_path)}  # 0755 from pytest: Mesa rejects it
    tmp_path.chmod(0o755)
    chosen = runtime_dir.ensure(env)
    assert chosen != str(tmp_path) and env["XDG_RUNTIME_DIR"] == chosen
    info = os.stat(chosen)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    assert runtime_dir.ensure({}) == chosen  # every port of this user shares it
    good = tmp_path / "mine"
    good.mkdir(mode=0o700)
    assert runtime_dir.ensure({"XDG_RUNTIME_DIR": str(good)}) == str(good)


@pytest.mark.parametrize(
    "line, level",
    [("error: XDG_RUNTIME_DIR is invalid", 40), ("WARNING: lavapipe is not a conformant", 30), ("MESA: info", 20)],
)
def test_native_lines_keep_their_own_level(line, level):
    assert level_of(line) == level


def test_health_names_the_cpu_fallback(port):
    health = port.call_plain("health")
    assert health["usable"] is True and health["adapter"]
    if health["kind"] == "cpu":
        assert "CPU" in health["reason"]
    else:
        assert health["kind"] == "gpu" and health["reason"] is None


def test_health_without_any_adapter_says_why():
    # No Vulkan ICD and no EGL vendor: wgpu finds nothing at all.
    env = {"VK_ICD_FILENAMES": "/nonexistent", "VK_DRIVER_FILES": "/nonexistent", "__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent"}
    with PortClient(env) as port:
        assert port.call_plain("ping") == "pong"  # liveness only
        health = port.call_plain("health")
        with pytest.raises(PortError) as caught:
            port.call("execute_kernel", b"double", b"\x01\x02\x03\x04", 1)
        wait_for(lambda: any(level == "error" for level, *_ in port.logs))
        logs = list(port.logs)
    assert health["usable"] is False and health["adapter"] is None and health["kind"] == "none"
    assert "No suitable graphics adapter found" in health["reason"]
    assert caught.value.reason == "no_adapter"
    assert any(level == "error" and "no usable adapter" in m for level, _, m, _ in logs)
