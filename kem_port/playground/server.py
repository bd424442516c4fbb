"""The playground's HTTP server: the page's three static files and two JSON
routes, on a loopback address only.

Why loopback only, and the checks on every request: the server runs any
WGSL it is sent on the author's GPU, as the author. A page on another site
could try to reach it through the browser, so
- it binds 127.0.0.0/8 only (``serve`` refuses any other address);
- the Host header must name that address or ``localhost`` with our port
  (a DNS-rebinding page arrives under its own host name): 421 otherwise;
- the JSON routes take ``Content-Type: application/json`` only, which a
  cross-site form cannot send and a cross-site fetch cannot send without a
  preflight this server never grants (no CORS headers at all);
- a body over MAX_BODY is refused (413) from its Content-Length, before a
  byte of it is read; one without a Content-Length is 411;
- every request carries the server's token (403 otherwise): loopback is
  every local user's, and on a shared machine another user could run
  kernels on the author's GPU. The URL ``kem playground`` prints holds it
  (``?token=``, as Jupyter does); the page's first load sets it as an
  HttpOnly, SameSite=Strict cookie, which the page's files and routes then
  carry; a script may send it as ``X-Kem-Token``.
Every failure is JSON ``{"ok": false, "error": {"reason", "detail"}}``;
an unexpected one is ``internal`` with no detail (it is logged).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
from http.cookies import CookieError, SimpleCookie
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kem_port.errors import KemError
from kem_port.playground.bench import Bench
from kem_port.playground.diagnostics import diagnostics, page_words

log = logging.getLogger("kem_port.playground")

# 24 MiB: a 16 MiB input file in base64 (4/3 of it, 21.3 MiB) plus the
# kernel text and fields; larger inputs belong to `kem run --input`.
MAX_BODY = 24 << 20
STATIC = {"/": ("index.html", "text/html; charset=utf-8"), "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/style.css": ("style.css", "text/css; charset=utf-8")}
# The page's own files only; images come back as data: URLs.
CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'"
# 127.0.0.0/8, and its first address the default bind (spelt so, because
# the version's one home is the only "N.N.N" string literal in kem_port).
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
DEFAULT_HOST = str(LOOPBACK[1])
# A request's line, headers and body must each arrive within this: a client
# that sends a Content-Length and then stalls held its thread forever.
BODY_TIMEOUT_S = 30.0
COOKIE = "kem_playground_token"
STATUS = {"bad_args": 400, "too_large": 413, "internal": 500, "no_adapter": 503, "overloaded": 503}


class PlaygroundServer(ThreadingHTTPServer):
    daemon_threads = True  # a request still running at Ctrl-C does not hold the exit

    def __init__(self, host: str, port: int, bench: Bench) -> None:
        if not loopback(host):
            raise KemError("bad_args", f"the playground serves this machine only: {host!r} is not a loopback address (127.x.x.x)")
        self.bench = bench
        self.token = secrets.token_urlsafe(24)  # 192 bits, this server's life only
        self.pages = {route: (resources.files(__package__).joinpath("static", name).read_bytes(), kind)
                      for route, (name, kind) in STATIC.items()}
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/?token={self.token}"


def loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address in LOOPBACK


def _not_json(name: str) -> None:
    """NaN and Infinity: Python reads them, JSON has no such words, and an
    answer echoing one (a check's report) would not parse in the page."""
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e999: a JSON number Python reads as inf
        raise ValueError(f"{text} is out of range")
    return value


class Handler(BaseHTTPRequestHandler):
    server: PlaygroundServer
    server_version = "kem-playground"
    sys_version = ""
    timeout = BODY_TIMEOUT_S  # socketserver sets it on the connection
    # Buffered: a reply's headers and a short body leave in one send (unbuffered,
    # they were two, and a client reading one recv saw the headers only).
    wbufsize = -1

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._host_ok() or not self._token_ok():
            return
        page = self.server.pages.get(urlsplit(self.path).path)
        if page is None:
            self._error(404, "not_found", "no such page")
            return
        self._send(200, page[1], page[0], cookie=True)  # only after the token was shown

    def do_POST(self) -> None:  # noqa: N802
        if not self._host_ok() or not self._token_ok():
            return
        route = {"/api/check": self.server.bench.check, "/api/run": self.server.bench.run}.get(self.path)
        if route is None:
            self._error(404, "not_found", "no such route")
            return
        body = self._body()
        if body is None:
            return
        try:
            answer = route(body)
        except KemError as exc:
            self._error(STATUS.get(exc.reason, 422), exc.reason, page_words(exc.detail), diagnostics(exc.reason, exc.detail))
            return
        except Exception:  # a bug, not the author's kernel: logged here, no internals in the reply
            log.exception("playground request failed")
            self._error(500, "internal", "internal error (details in the playground's log)")
            return
        self._json(200, answer)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, an unknown method: 400, 414, 501) as JSON too."""
        self.close_connection = True
        reason = "not_implemented" if code == 501 else "bad_args"
        self._error(code, reason, message or HTTPStatus(code).phrase)

    def _host_ok(self) -> bool:
        port = self.server.server_address[1]
        host = self.headers.get("Host", "")
        if host not in (f"{self.server.server_address[0]}:{port}", f"localhost:{port}"):
            self._error(421, "bad_host", "the playground answers only to its own address")
            return False
        return True

    def _token_ok(self) -> bool:
        """The server's token from the URL, the X-Kem-Token header or the page's cookie."""
        given = parse_qs(urlsplit(self.path).query).get("token", [""])[0] or self.headers.get("X-Kem-Token", "")
        if not given:
            cookie = SimpleCookie()
            try:
                cookie.load(self.headers.get("Cookie", ""))
            except CookieError:
                pass
            given = cookie[COOKIE].value if COOKIE in cookie else ""
        if hmac.compare_digest(given.encode(), self.server.token.encode()):
            return True
        self._error(403, "forbidden", "open the URL `kem playground` printed: it carries this server's token")
        return False

    def _body(self) -> dict | None:
        if self.headers.get_content_type() != "application/json":
            self._error(415, "bad_args", "send application/json")
            return None
        length = self.headers.get("Content-Length")
        # ASCII digits only, and few of them: str.isdigit() passes '²', which
        # int() refuses, and int() refuses 4,300 digits or more.
        if length is None or not (length.isascii() and length.isdigit() and len(length) <= 20):
            self._error(411, "bad_args", "a Content-Length is required")
            return None
        if int(length) > MAX_BODY:
            self.close_connection = True  # the body is never read
            self._error(413, "too_large", f"request body of {length} bytes, over the playground's {MAX_BODY}")
            return None
        try:
            data = self.rfile.read(int(length))
        except OSError:  # TimeoutError: the body stalled
            self.close_connection = True
            self._error(408, "bad_args", f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s")
            return None
        try:
            body = json.loads(data, parse_constant=_not_json, parse_float=_finite)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; deep nesting a RecursionError
            self._error(400, "bad_args", "the body is not JSON")
            return None
        if not isinstance(body, dict):
            self._error(400, "bad_args", "the body is a JSON object")
            return None
        return body

    def _error(self, status: int, reason: str, detail: str, found: list | None = None) -> None:
        self._json(status, {"ok": False, "error": {"reason": reason, "detail": detail}, "diagnostics": found or []})

    def _json(self, status: int, value: Any) -> None:
        self._send(status, "application/json", json.dumps(value).encode())

    def _send(self, status: int, kind: str, data: bytes, cookie: bool = False) -> None:
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        if cookie:  # the page's files and routes carry the token as this cookie (never readable by script)
            self.send_header("Set-Cookie", f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.debug("%s " + format, self.address_string(), *args)
