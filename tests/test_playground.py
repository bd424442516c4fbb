"""`kem playground`'s server without a browser: a real server on a real
socket, real wgpu. Values against numpy on fresh random inputs; every
refusal JSON with a reason; the loopback-only bind and the body cap."""

from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import urlsplit
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import playground_process, playground_server, stopped_by
from kem_port.playground.server import MAX_BODY, PlaygroundServer
from kem_port.errors import KemError

ROOT = Path(__file__).resolve().parents[1]
XOR = """@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(2) var<uniform> key: vec4<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i] ^ key.x;
}
"""
ADD = """@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;

@compute @workgroup_size(32)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&c)) { c[gid.x] = a[gid.x] * 2.0 + b[gid.x]; }
}
"""


@pytest.fixture(scope="module")
def server():
    with playground_server() as srv:
        yield srv


def request(server, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", "X-Kem-Token": server.token, **(headers or {})})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_check_places_naga_and_lexer_errors_at_their_line_and_column(server):
    status, answer = request(server, "POST", "/api/check", {"code": XOR.replace("key.x;", "kee.x;")})
    assert status == 200 and answer["ok"] is False
    line = next(n for n, t in enumerate(XOR.splitlines(), 1) if "key.x;" in t)
    col = XOR.splitlines()[line - 1].index("key.x;") + 1
    assert [(d["line"], d["col"]) for d in answer["diagnostics"]] == [(line, col)]
    assert "kee" in answer["diagnostics"][0]["message"]
    # A character the canonical lexer refuses: kem's own place, line 3 column 5.
    status, answer = request(server, "POST", "/api/check", {"code": "// ok\n\n    \u00e9"})
    assert status == 200 and answer["diagnostics"][0]["line"] == 3 and answer["diagnostics"][0]["col"] == 5
    status, answer = request(server, "POST", "/api/check", {"code": XOR})
    assert status == 200 and answer["ok"] and answer["mode"] == "kem" and answer["diagnostics"] == []
    assert [b["name"] for b in answer["report"]["bindings"]] == ["input_words", "output_words", "key"]


@pytest.mark.parametrize("words", [1, 63, 65, 2000])
def test_a_kem_run_is_numpys_answer_and_warm_after_the_first(server, words, rng):
    seed, key = int(rng.integers(0, 1 << 31)), int(rng.integers(0, 1 << 32))
    body = {"code": XOR, "input": {"kind": "random", "size": words * 4, "seed": seed}, "params": f"{key},0,0,0"}
    status, answer = request(server, "POST", "/api/run", body)
    assert status == 200, answer
    x = np.frombuffer(np.random.default_rng(seed).bytes(words * 4), "<u4")
    (out,) = answer["outputs"]
    assert bytes.fromhex(out["hex"]) == (x ^ np.uint32(key)).astype("<u4").tobytes()[:4096]
    assert out["bytes"] == words * 4 and answer["dispatch_rule"] == "1-D"
    assert answer["workgroups"] == [-(-words // 64), 1, 1]
    # GPU time from timestamps where the adapter has them (lavapipe does), else said why.
    assert answer["gpu_ms"] > 0 if answer["gpu_ms"] is not None else answer["gpu_note"] == "the adapter has no timestamp queries"
    status, again = request(server, "POST", "/api/run", body)
    assert again["warm"] and again["timings_ms"]["device_open"] == 0 and again["outputs"] == answer["outputs"]


def test_a_named_run_is_numpys_answer(server, rng):
    n = int(rng.integers(1, 500))
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    body = {"code": ADD, "mode": "named", "grid": [n], "outputs": {"c": n * 4},
            "buffers": {"a": {"kind": "hex", "text": a.tobytes().hex()},
                        "b": {"kind": "file", "data": __import__("base64").b64encode(b.tobytes()).decode()}}}
    status, answer = request(server, "POST", "/api/run", body)
    assert status == 200, answer
    (out,) = answer["outputs"]
    assert out["name"] == "c" and answer["dispatch_rule"] == "grid"
    assert answer["gpu_ms"] is None and answer["gpu_note"] == "runs by named buffers take no GPU timestamps"
    assert np.array_equal(np.frombuffer(bytes.fromhex(out["hex"]), np.float32), (a * 2 + b)[:1024])


def test_refusals_are_json_with_a_reason(server):
    cases = [
        ({"code": XOR, "input": {"kind": "random", "size": -1}}, 400, "bad_args"),
        ({"code": XOR, "input": {"kind": "random", "size": 1 << 40}}, 413, "too_large"),
        ({"code": XOR, "input": {"kind": "file", "data": "@@"}}, 400, "bad_args"),
        ({"code": XOR.replace("key.x", "nope"), "input": {"kind": "hex", "text": "00"}, "params": "1,0,0,0"}, 422, "shader_error"),
        ({"code": ADD, "mode": "named", "outputs": {"c": 4}}, 400, "bad_args"),  # no grid
    ]
    for body, status, reason in cases:
        got, answer = request(server, "POST", "/api/run", body)
        assert (got, answer["error"]["reason"]) == (status, reason), answer
        assert "/" not in answer["error"]["detail"].replace("G/B", "")  # no server paths
    assert request(server, "GET", "/nope")[0] == 404
    assert request(server, "POST", "/api/run", {"code": XOR}, {"Content-Type": "text/plain"})[0] == 415
    assert request(server, "GET", "/", headers={"Host": "rebound.example:80"}) == (
        421, {"ok": False, "error": {"reason": "bad_host", "detail": "the playground answers only to its own address"}, "diagnostics": []})


def test_a_body_over_the_cap_is_refused_from_its_length_before_it_is_read(server):
    with socket.create_connection(server.server_address[:2], timeout=10) as sock:
        host, port = server.server_address[:2]
        sock.sendall(f"POST /api/run HTTP/1.1\r\nHost: {host}:{port}\r\nX-Kem-Token: {server.token}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {MAX_BODY + 1}\r\n\r\n{{".encode())
        reply = sock.recv(65536).decode()  # answered although 24 MiB never come
    assert reply.startswith("HTTP/1.0 413") and '"too_large"' in reply


def test_the_playground_binds_loopback_only():
    with pytest.raises(KemError, match="loopback"):
        PlaygroundServer("0.0.0.0", 0, None)  # type: ignore[arg-type]
    done = subprocess.run([sys.executable, "-m", "kem_port.cli", "playground", "--host", "0.0.0.0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 1 and "loopback" in done.stderr and done.stdout == ""


SEVENS = """struct KemDebug { count: atomic<u32>, records: array<u32> }
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(15) var<storage, read_write> kem_debug: KemDebug;

fn note(v: u32) {
    let i = atomicAdd(&kem_debug.count, 1u);
    if (i < arrayLength(&kem_debug.records)) { kem_debug.records[i] = v; }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i] + 1u;
    if (input_words[i] % 7u == 0u) { note(i); }
}
"""


def test_debug_records_come_back_with_the_output(server, rng):
    words = int(rng.integers(100, 3000))
    x = rng.integers(0, 50, words, dtype=np.uint32)
    body = {"code": SEVENS, "input": {"kind": "hex", "text": x.astype("<u4").tobytes().hex()}, "debug": True}
    status, answer = request(server, "POST", "/api/run", body)
    assert status == 200, answer
    assert sorted(answer["debug"]["records"]) == np.flatnonzero(x % 7 == 0).tolist()
    assert answer["debug"]["dropped"] == 0
    assert bytes.fromhex(answer["outputs"][0]["hex"]) == (x + 1).astype("<u4").tobytes()[:4096]


def test_http_servers_own_refusals_are_json_too(server):
    status, answer = request(server, "DELETE", "/api/run")
    assert status == 501 and answer["error"]["reason"] == "not_implemented"
    with socket.create_connection(server.server_address[:2], timeout=10) as sock:
        sock.sendall(b"GARBAGE\r\n\r\n")
        reply = sock.recv(65536).decode()
    assert reply.endswith('"diagnostics": []}') and '"reason": "bad_args"' in reply  # HTTP/0.9 style: the body alone


def start_playground(*args: str) -> tuple[subprocess.Popen, str]:
    proc = playground_process(*args)
    line = proc.stdout.readline()
    assert line.startswith("kem playground: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split()[2]


def test_ctrl_c_stops_the_playground_cleanly_and_a_taken_port_is_one_line():
    import signal

    proc, url = start_playground()
    try:
        taken = subprocess.run([sys.executable, "-m", "kem_port.cli", "playground", "--port", str(urlsplit(url).port)],
                               capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert taken.returncode == 1 and taken.stderr.startswith("kem: cannot serve on 127.0.0.1:") and len(taken.stderr.splitlines()) == 1
    finally:
        code, stderr = stopped_by(proc, signal.SIGINT)
    assert code == 0 and "stopped" in stderr, stderr


def test_every_request_needs_the_servers_token(server):
    """Loopback is every local user's: without the token the URL carries (or
    the cookie the page's load sets, or X-Kem-Token) nothing is served and
    nothing runs, and a refusal never hands the token out."""
    host, port = server.server_address[:2]

    def ask(method: str, path: str, headers: dict) -> tuple[int, dict, str]:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request(method, path, body=json.dumps({"code": XOR}) if method == "POST" else None,
                     headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("Set-Cookie") or ""

    for headers in ({}, {"X-Kem-Token": "x" * 32}, {"Cookie": "kem_playground_token=" + "y" * 32}, {"Cookie": "garbage=\x01;;"}):
        for method, path in (("GET", "/"), ("GET", "/app.js"), ("POST", "/api/check"), ("POST", "/api/run")):
            status, body, cookie = ask(method, path, headers)
            assert status == 403 and json.loads(body)["error"]["reason"] == "forbidden", (method, path, headers)
            assert server.token not in cookie
    assert ask("GET", "/?token=wrong", {})[0] == 403
    status, page, cookie = ask("GET", urlsplit(server.url).path + "?" + urlsplit(server.url).query, {})
    assert status == 200 and b"<html" in page.lower()
    assert cookie.startswith(f"kem_playground_token={server.token};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = {"Cookie": cookie.split(";", 1)[0]}
    assert ask("GET", "/app.js", jar)[0] == 200
    status, body, _ = ask("POST", "/api/check", jar)
    assert status == 200 and json.loads(body)["ok"] is True
