"""Red team of the faces that landed in one wave (the warm process, the
playground, the dashboard, the Python API): each test is an attack that
worked on the code before its fix, run against the real parts (real files
and sockets, a real HTTP server on a real port, real wgpu on lavapipe).
"""

from __future__ import annotations

import os
import stat
import tempfile

import numpy as np
import pytest

from conftest import playground_server
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


def _start_warm(folder, env, cwd=None):
    import subprocess
    import sys
    import time

    sock = folder / "kem-warm-red.sock"
    proc = subprocess.Popen([sys.executable, "-m", "kem_port.warm", str(sock), "120"], env=env, cwd=cwd,
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


# -- the playground ----------------------------------------------------------


@pytest.fixture(scope="module")
def playground():
    with playground_server() as srv:
        yield srv


def _raw(server, head: str, body: bytes = b"", timeout: float = 60) -> tuple[int | None, dict | None]:
    """One request as raw bytes (header values a client library would not
    send); the status and JSON answer, or (None, None) if the connection
    closed with no answer."""
    import json
    import socket

    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(head.replace("HOST", f"127.0.0.1:{port}\r\nX-Kem-Token: {server.token}").encode("latin-1") + body)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    if not got:
        return None, None
    status_line, _, rest = got.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2], parse_constant=_standard_only)


def _standard_only(name: str) -> None:
    raise AssertionError(f"the answer is not standard JSON: it holds {name}")


def _post_head(length: str) -> str:
    return f"POST /api/check HTTP/1.1\r\nHost: HOST\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"


@pytest.mark.parametrize("length", ["\u00b2", "\u00b9\u00b3", "1" * 5000])
def test_playground_odd_content_length_is_a_json_refusal(playground, length):
    """A Content-Length of non-ASCII digits (latin-1 superscripts: str.isdigit
    says yes, int() says no) or of 5,000 digits (past Python's int parsing
    limit) raised out of the handler: no answer, a traceback on the console."""
    status, answer = _raw(playground, _post_head(length))
    assert status == 411 and answer["error"]["reason"] == "bad_args"


def test_playground_deeply_nested_body_is_a_json_refusal(playground):
    body = b"[" * 200_000  # json.loads: RecursionError, not ValueError
    status, answer = _raw(playground, _post_head(str(len(body))), body)
    assert status == 400 and answer["error"] == {"reason": "bad_args", "detail": "the body is not JSON"}


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_playground_answers_standard_json_only(playground, constant):
    """Python's json reads NaN and Infinity (and 1e999 as inf); /api/check
    echoed them back in its report as bare NaN/Infinity, which a browser's
    response.json() cannot parse. The body is refused as not JSON instead."""
    import json

    code = json.dumps("override A: f32 = 1.0;\n@compute @workgroup_size(1) fn main() { }\n").encode()
    body = b'{"code": ' + code + b', "constants": {"A": ' + constant + b"}}"
    status, answer = _raw(playground, _post_head(str(len(body))), body)
    assert status == 400 and answer["error"]["reason"] == "bad_args", answer


def test_playground_a_stalled_body_is_answered_not_held(playground, monkeypatch):
    """A client that sends a Content-Length and stalls held its thread
    forever (no socket timeout); now it is answered 408 after
    BODY_TIMEOUT_S (set to 1 s here, on the real handler class)."""
    import time

    from kem_port.playground import server

    assert server.Handler.timeout == server.BODY_TIMEOUT_S == 30.0
    monkeypatch.setattr(server.Handler, "timeout", 1.0)
    started = time.monotonic()
    status, answer = _raw(playground, _post_head("100"), b"{", timeout=20)
    assert status == 408 and answer["error"]["reason"] == "bad_args"
    assert time.monotonic() - started < 10


LONG_LOOP = """@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= arrayLength(&output_words)) { return; }
  var x = input_words[g.x] | 1u;
  loop { if (x == 0u) { break; } x = x * 3u + 2u; }
  output_words[g.x] = x;
}
"""
DOUBLE = """@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x < arrayLength(&output_words)) { output_words[g.x] = input_words[g.x] * 2u + 1u; }
}
"""


def _post(server, route: str, body: dict, timeout: float = 300) -> tuple[int, dict]:
    import http.client
    import json

    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=timeout)
    conn.request("POST", route, body=json.dumps(body), headers={"Content-Type": "application/json", "X-Kem-Token": server.token})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_playground_stays_responsive_while_a_long_run_holds_the_device(playground, rng):
    """A Run has no deadline, only gas: a loop that never ends on its own,
    over 2^18 invocations, ran 24.5 s on lavapipe before its gas or the
    driver stopped it (~8 s with KEM_GAS_TURNS' 60,000 turns a lane). The editor's check (every pause in typing)
    waited behind it for all of that; now it is answered `overloaded` within
    BUSY_WAIT_S, and the server serves normally after."""
    import threading
    import time

    from kem_port.playground.bench import BUSY_WAIT_S

    bench = playground.bench
    status, answer = _post(playground, "/api/run", {"code": LONG_LOOP, "input": {"kind": "hex", "text": "01000000"}})
    assert (status, answer["error"]["reason"]) == (422, "gas_exhausted")  # compiled now; one lane runs out at once
    long_run: dict = {}
    thread = threading.Thread(target=lambda: long_run.update(answer=_post(
        playground, "/api/run", {"code": LONG_LOOP, "input": {"kind": "random", "size": 1 << 20, "seed": 3}})))
    thread.start()
    deadline = time.monotonic() + 30
    while not bench._lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    status, answer = _post(playground, "/api/check", {"code": DOUBLE})
    waited = time.monotonic() - started
    still_running = thread.is_alive()
    thread.join(300)
    status_long, answer_long = long_run["answer"]  # its gas runs out (KEM_GAS_TURNS a lane): a refusal, not a hang
    assert (status_long, answer_long["error"]["reason"]) == (422, "gas_exhausted"), answer_long
    assert waited < BUSY_WAIT_S + 3, f"the check waited {waited:.1f} s behind the Run"
    assert still_running and (status, answer["error"]["reason"]) == (503, "overloaded"), answer
    # After it, the device serves again: a Run equals numpy.
    words = rng.integers(0, 1 << 32, int(rng.integers(1, 3000)), dtype=np.uint32)
    status, answer = _post(playground, "/api/run", {"code": DOUBLE, "input": {"kind": "hex", "text": words.tobytes().hex()}})
    assert status == 200 and answer["outputs"][0]["hex"] == (words * np.uint32(2) + np.uint32(1)).astype("<u4").tobytes()[:4096].hex()


EVIL_PAGE = """<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="form" method="POST" action="PG/api/run" enctype="text/plain" target="sink">
<input name='{"code": "CODE", "x": "' value='"}'></form>
<script>
const pg = "PG", body = JSON.stringify({code: "CODE", input: {kind: "hex", text: "01000000"}});
const tried = {};
async function attempt(name, url, init) {
  try { const r = await fetch(url, init); tried[name] = "answered " + r.type + " " + r.status; }
  catch (e) { tried[name] = "blocked"; }
}
(async () => {
  await attempt("no_cors_text", pg + "/api/run", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body});
  await attempt("no_cors_form", pg + "/api/run", {method: "POST", mode: "no-cors", body: new URLSearchParams({code: "x"})});
  await attempt("cors_json", pg + "/api/run", {method: "POST", headers: {"Content-Type": "application/json"}, body});
  await attempt("cors_read", pg + "/app.js", {});
  navigator.sendBeacon(pg + "/api/run", body);
  document.getElementById("form").submit();
  setTimeout(() => { document.title = "done " + JSON.stringify(tried); }, 1500);
})();
</script></body></html>"""


def test_playground_a_strangers_page_cannot_run_or_read_it(playground, caplog):
    """A page on another origin the author visits in the same browser (real
    headless Chromium): text/plain and form-encoded no-cors POSTs, a form
    post, sendBeacon, a JSON POST (preflighted) and a cross-origin read.
    None reaches a Run: the server answers them 403 (no token: the
    author's own page load left its cookie, which SameSite=Strict keeps off
    another site's requests) or 501 (the preflight), never 200, and the
    page reads nothing. And a DNS-rebinding name that resolves to the
    playground's address gets 421, not the page."""
    import http.server
    import json
    import logging
    import threading

    from browser import wait_for

    host, port = playground.server_address[:2]
    origin = f"http://{host}:{port}"
    page = EVIL_PAGE.replace("PG", origin).replace("CODE", "@compute @workgroup_size(1) fn main() {}").encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    driver = open_browser_resolving(f"MAP rebind.test {host}")
    try:
        driver.get(playground.url)  # the author's tab: the token's cookie is in this browser now
        with caplog.at_level(logging.DEBUG, logger="kem_port.playground"):
            driver.get(f"http://127.0.0.2:{evil.server_address[1]}/")
            title = wait_for(driver, lambda d: d.title.startswith("done") and d.title)
            tried = json.loads(title[len("done "):])
            assert tried["cors_json"] == "blocked" and tried["cors_read"] == "blocked", tried
            driver.get(f"http://rebind.test:{port}/")
            text = driver.find_element("tag name", "body").text
            assert '"bad_host"' in text and "kem" not in driver.title.lower()
        lines = [r.getMessage() for r in caplog.records if r.name == "kem_port.playground"]
        runs = [line for line in lines if "/api/run" in line]
        assert runs, lines  # the attempts did arrive
        assert not [line for line in runs if '" 200 ' in line], runs
        assert all('" 403 ' in line or '" 501 ' in line for line in runs), runs
    finally:
        driver.quit()
        evil.shutdown()
        evil.server_close()


def open_browser_resolving(rule: str):
    """tests/browser.py's Chromium with a host-resolver rule (a DNS-rebinding name)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from browser import WINDOW, chromium_paths

    binary, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--host-resolver-rules={rule}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root")
def test_another_user_is_not_served_by_my_warm_process(tmp_path):
    """The runtime dir (0700) and the socket (0600) keep other users out;
    with both loosened here on purpose, the server's peer-uid check is the
    second lock: a process of uid 65534 that connects and sends a full
    request with its three fds gets the connection closed, no answer, and
    nothing is run (its -o file is never written)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from kem_port.warm import client

    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="kem-red-warm-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        env = {**os.environ, "PYTHONPATH": str(root), "KEM_KERNEL_DIR": str(tmp_path / "kernels")}
        proc, path = _start_warm(folder, env)
        try:
            path.chmod(0o666)  # loosened: only the uid check is left
            out = folder / "out.bin"
            request = json.dumps({"argv": ["run", "double", "--hex", "01000000", "-o", str(out)], "cwd": "/", "umask": 0}).encode()
            stranger = (
                "import os, socket, sys\n"
                "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])\n"
                "try:\n"
                "    socket.send_fds(s, [bytes.fromhex(sys.argv[2])], [0, 1, 2]); s.settimeout(60)\n"
                "    print(repr(s.recv(100)))\n"
                "except (BrokenPipeError, ConnectionResetError):\n"
                "    print('closed')\n")
            done = subprocess.run([sys.executable, "-c", stranger, str(path), (client.HEADER.pack(len(request)) + request).hex()],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() in ("b''", "closed")  # dropped at once, no answer
            assert not out.exists() and proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def test_a_warm_bug_goes_to_the_warm_log_and_one_line_to_the_command(tmp_path):
    """An unexpected exception while running a command (here a cwd holding a
    NUL byte: os.chdir's ValueError) is one line for the command, its
    traceback in the warm process's own log, as the message says. Before,
    the log handler wrote to the current sys.stderr, the client's: the
    client got the whole traceback with the server's paths, the log nothing."""
    from pathlib import Path

    from kem_port.warm import client

    root = Path(__file__).resolve().parents[1]
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(root), "KEM_KERNEL_DIR": str(tmp_path / "kernels")}
    proc, path = _start_warm(folder, env)
    try:
        sock = client.connect(path)
        assert sock is not None
        with sock, open(tmp_path / "err.txt", "wb") as err:
            code, pid = _ask_with_stderr(sock, err, {"argv": ["run", "double", "--hex", "01000000"], "cwd": "/tmp/\0x", "umask": 0o022})
        assert (code, pid) == (1, proc.pid)
        assert (tmp_path / "err.txt").read_text() == "kem: internal error in the warm process (its log has the details)\n"
    finally:
        proc.terminate()
        proc.wait(30)
    log = proc.stderr.read().decode()
    assert "Traceback" in log and "embedded null byte" in log


def test_playground_refusals_speak_the_pages_words_not_erlang(playground):
    """The port's refusals name Erlang terms and the decoder's Python types;
    the page showed them as they were (`not OtpErlangBinary(b'../x',bits=8)`,
    `(atoms or binaries)`, `<<"G/B">>`, `outputs => #{c => Bytes}`)."""
    add = ("@group(0) @binding(0) var<storage, read> a: array<f32>;\n"
           "@group(0) @binding(1) var<storage, read_write> c: array<f32>;\n"
           "@compute @workgroup_size(32) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
           "  if (g.x < arrayLength(&c)) { c[g.x] = a[g.x]; } }\n")
    one = {"kind": "hex", "text": "0000803f"}
    cases = [
        ("/api/check", {"code": DOUBLE, "constants": {"../x": 1}}, "'../x'"),
        ("/api/run", {"code": DOUBLE, "input": one, "constants": {"../x": 1}}, "'../x'"),
        ("/api/run", {"code": add, "mode": "named", "grid": [1], "buffers": {"../x": one}, "outputs": {}}, "G/B"),
        ("/api/run", {"code": add, "mode": "named", "grid": [1], "buffers": {"a": one}, "outputs": {}}, "an output size for c"),
    ]
    for route, body, said in cases:
        status, answer = _post(playground, route, body)
        texts = [d["message"] for d in answer["diagnostics"]] + ([answer["error"]["detail"]] if "error" in answer else [])
        assert texts and any(said in t for t in texts), (route, texts)
        for text in texts:
            for erlang in ("OtpErlang", "atom or binar", "atoms or binar", "<<", "=>", "#{"):
                assert erlang not in text, (route, text)


def _peak_rss_reset() -> int:
    """Reset this process's peak RSS (Linux: clear_refs 5) and return the RSS now, in KiB."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status_kib("VmRSS")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(field + ":")).split()[1])


def test_playground_a_png_bomb_is_refused_before_it_is_decoded(playground):
    """A 17.5 KB PNG of 12000 x 12000 one-bit pixels is 576 MB as RGBA:
    it was decoded (1.8 GB at the peak, in the server's process) before any
    size was checked. Its size is read from the header and refused first."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (12000, 12000)).save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    assert len(data) < 30_000
    before = _peak_rss_reset()
    status, answer = _post(playground, "/api/run", {"code": DOUBLE, "input": {"kind": "file", "data": data, "png": True}})
    grew_mib = (_status_kib("VmHWM") - before) / 1024
    assert status == 413 and answer["error"]["reason"] == "too_large", answer
    assert "12000 x 12000 PNG" in answer["error"]["detail"]
    assert grew_mib < 100, f"the server's peak memory grew {grew_mib:.0f} MiB"


def test_playground_a_png_past_pillows_own_limit_is_too_large(playground):
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (20000, 10000)).save(buf, format="PNG")  # 200 M pixels: Pillow refuses it at open
    status, answer = _post(playground, "/api/run", {"code": DOUBLE, "input": {
        "kind": "file", "data": base64.b64encode(buf.getvalue()).decode(), "png": True}})
    assert status == 413 and answer["error"]["reason"] == "too_large", answer


@pytest.mark.parametrize("size", [(12000, 12000), (20000, 10000)])
def test_kem_run_refuses_a_png_bomb_from_its_header(tmp_path, size):
    """`kem run --input bomb.png`: the same 17.5 KB PNG decoded to 576 MB
    (1.8 GB at the peak) before KEM_MAX_INPUT_BYTES was checked; one past
    Pillow's own limit said "not a readable PNG". Both are too_large now,
    read from the header, the process's peak memory staying small."""
    import subprocess
    import sys
    from pathlib import Path

    from PIL import Image

    Image.new("1", size).save(tmp_path / "bomb.png", format="PNG")
    code = ("import sys\nfrom kem_port.cli import main\ncode = main(sys.argv[1:])\n"
            "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code, "run", "double", "--input", str(tmp_path / "bomb.png"), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert "too_large" in done.stderr and "bomb.png" in done.stderr, done.stderr
    assert int(done.stdout.split()[-1]) < 400 * 1024, f"peak RSS {done.stdout.split()[-1]} KiB"
    assert not (tmp_path / "o").exists()


def test_playground_named_inputs_are_summed_before_any_is_made(playground):
    """Each named input alone within KEM_MAX_INPUT_BYTES (256 MiB), four
    random ones of 200 MiB were all made (800 MB) before their total was
    refused: a 300-byte request. The declared sizes are summed first."""
    add = ("@group(0) @binding(0) var<storage, read> a: array<u32>;\n"
           "@group(0) @binding(1) var<storage, read_write> c: array<u32>;\n"
           "@compute @workgroup_size(32) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
           "  if (g.x < arrayLength(&c)) { c[g.x] = a[g.x]; } }\n")
    buffers = {f"b{i}": {"kind": "random", "size": 200 << 20, "seed": i} for i in range(4)}
    before = _peak_rss_reset()
    status, answer = _post(playground, "/api/run", {"code": add, "mode": "named", "grid": [1], "buffers": buffers, "outputs": {"c": 4}})
    grew_mib = (_status_kib("VmHWM") - before) / 1024
    assert status == 413 and answer["error"]["reason"] == "too_large", answer
    assert grew_mib < 100, f"the server's peak memory grew {grew_mib:.0f} MiB"


def test_a_warm_process_ends_when_its_sources_change(tmp_path):
    """An edit of kem_port's sources changes the warm key, so every later
    --warm command starts a new process; the old one held its device and
    worker (~260 MB on lavapipe) for its 10 idle minutes, one per edit.
    It now sees the change at its next accept poll and ends, socket and
    all. Run on a copy of kem_port, so the shared tree is not touched."""
    import shutil
    import time
    from pathlib import Path

    from kem_port.warm.server import ACCEPT_POLL_S

    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "src"
    shutil.copytree(root / "kem_port", copy / "kem_port", ignore=shutil.ignore_patterns("__pycache__"))
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(copy), "KEM_KERNEL_DIR": str(tmp_path / "kernels")}
    proc, path = _start_warm(folder, env, cwd=copy)  # -m puts the cwd first on sys.path
    try:
        time.sleep(ACCEPT_POLL_S + 1)
        assert proc.poll() is None  # unchanged sources: it serves on
        edited = copy / "kem_port" / "warm" / "__init__.py"
        edited.write_text(edited.read_text() + "# edited\n")
        assert proc.wait(timeout=ACCEPT_POLL_S * 4 + 10) == 0
        assert not path.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
