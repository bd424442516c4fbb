"""A small Python client for the port: what Erlang's kem_port does, for
tools, tests and machines without Erlang (the GPU bench driver).

It speaks exactly the wire protocol of docs/protocol.md over the child's
pipes; replies may come back out of order and are matched by ReqId.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from kem_port.errors import KemError
from kem_port.wire import terms
from kem_port.wire.batch_frames import encode_calls, split_replies
from kem_port.wire.framing import HEADER, read_frame
from kem_port.wire.group_frames import encode_group


# The port's {error, {Reason, Detail}} is the one error type of kem_port.api;
# PortError is its older name here, kept for the imports that use it.
PortError = KemError


def plain(value: Any) -> Any:
    """erlang-py terms as plain Python: atoms become str (true, false and
    undefined become True, False and None), binaries become str when they
    are UTF-8 text and bytes otherwise, maps become dicts with str keys,
    tuples and lists stay tuples and lists."""
    name = terms.atom_name(value)
    if name is not None:
        return value if isinstance(value, bool) or value is None else name
    data = terms.binary_bytes(value)
    if data is not None or isinstance(value, bytes):
        raw = data if data is not None else value
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
    if isinstance(value, dict):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


class PortClient:
    """Starts ``python -m kem_port`` (or a script that speaks the same
    protocol, such as tools/echo_port.py) and calls it; thread-safe."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        python: str | None = None,
        module: str = "kem_port",
        script: str | None = None,
    ) -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        program = [script] if script is not None else ["-m", module]
        self.proc = subprocess.Popen(
            [python or sys.executable, *program],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=full_env,
            bufsize=0,
        )
        self._ids = itertools.count(1)
        self._pending: dict[Any, Future] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.unmatched: list[Any] = []
        # The port's log frames (docs/protocol.md), newest last, as plain
        # (level, logger, message, meta); each is also re-logged here.
        self.logs: deque[tuple[str, str, str, dict]] = deque(maxlen=1000)
        self.fatal: tuple[str, str] | None = None
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    def send_raw(self, payload: bytes) -> None:
        with self._write_lock:
            self.proc.stdin.write(HEADER.pack(len(payload)) + payload)

    def call_async(self, method: str, *args: Any, timeout_ms: int | None = None) -> Future:
        """Send a request; with timeout_ms the port is told the caller's
        timeout, as the Erlang owner does (docs/protocol.md)."""
        req_id = next(self._ids)
        return self.call_raw_frame(terms.encode(self._request(req_id, method, args, timeout_ms)), [req_id])[0]

    def call_batch_async(self, calls: list[tuple], timeout_ms: int | None = None) -> list[Future]:
        """Send calls (each ``(method, *args)``) in one calls frame, as the
        Erlang owner does when many callers wait (batch_frames.py)."""
        futures: list[Future] = []
        frames: list[bytes] = []
        for method, *args in calls:
            req_id = next(self._ids)
            fut: Future = Future()
            with self._lock:
                self._pending[req_id] = fut
            futures.append(fut)
            frames.append(terms.encode(self._request(req_id, method, args, timeout_ms)))
        self.send_raw(encode_calls(frames))
        return futures

    def call_group_async(self, kernel_id: bytes, inputs: list[bytes], hint: int = 1, timeouts_ms: list[int] | int = 0) -> list[Future]:
        """N calls to one kernel as one group frame (group_frames.py); timeouts per call or for all (0: none)."""
        req_ids = self.next_req_ids(len(inputs))
        timeouts = timeouts_ms if isinstance(timeouts_ms, list) else [timeouts_ms] * len(inputs)
        return self.call_raw_frame(encode_group(kernel_id, hint, list(zip(req_ids, timeouts)), inputs), req_ids)

    def next_req_ids(self, n: int) -> list[int]:
        return [next(self._ids) for _ in range(n)]

    def call_raw_frame(self, frame: bytes, req_ids: list[int]) -> list[Future]:
        """Send a hand-made frame (possibly hostile, or a calls frame: call_raw_batch); futures for req_ids."""
        futures = [Future() for _ in req_ids]
        with self._lock:
            self._pending.update(zip(req_ids, futures))
        self.send_raw(frame)
        return futures

    def call_raw_batch(self, frames: list[bytes], req_ids: list[int]) -> list[Future]:
        return self.call_raw_frame(encode_calls(frames), req_ids)

    @staticmethod
    def _request(req_id: int, method: str, args: Any, timeout_ms: int | None) -> tuple:
        term: tuple = (terms.atom("call"), req_id, terms.atom(method), tuple(terms.to_term(a) for a in args))
        return term + (timeout_ms,) if timeout_ms is not None else term

    def call_raw(self, build: Callable[[int], bytes], timeout: float = 60.0) -> Any:
        """Send the frame build(ReqId) makes (a hand-made, possibly hostile
        request) and wait for the reply to that ReqId."""
        req_id = next(self._ids)
        fut: Future = Future()
        with self._lock:
            self._pending[req_id] = fut
        self.send_raw(build(req_id))
        return fut.result(timeout)

    def call(self, method: str, *args: Any, timeout: float = 60.0) -> Any:
        """The raw reply: bytes for a binary result, erlang-py terms otherwise
        (maps keyed by OtpErlangAtom). Raises PortError on {error, ...}."""
        return self.call_async(method, *args).result(timeout)

    def call_plain(self, method: str, *args: Any, timeout: float = 60.0) -> Any:
        """The reply as plain Python (see :func:`plain`): e.g.
        ``client.call_plain("config")["verify"] == "strict"``,
        ``client.call_plain("ping") == "pong"``, and
        ``json.loads(client.call_plain("adapter_info"))``."""
        return plain(self.call(method, *args, timeout=timeout))

    def _read_loop(self) -> None:
        fd = self.proc.stdout.fileno()
        while True:
            body = read_frame(fd, 1 << 40)
            if body is None:
                break
            results = split_replies(body)
            if results is None:
                self._dispatch(terms.decode(body))
                continue
            for req_id, data in results:  # a replies frame (batch_frames.py)
                self._dispatch((terms.atom("reply"), req_id, (terms.atom("ok"), terms.Binary(data))))
        with self._lock:
            pending, self._pending = self._pending, {}
        error = PortError(*self.fatal) if self.fatal else PortError("port_exited", str(self.proc.poll()))
        for fut in pending.values():
            fut.set_exception(error)

    def _dispatch(self, reply: Any) -> None:
        tag = terms.atom_name(reply[0])
        if tag == "log":
            self._log(reply)
            return
        if tag == "fatal":
            self.fatal = (terms.atom_name(reply[1][0]) or "?", plain(reply[1][1]))
            return
        _, req_id, result = reply
        with self._lock:
            fut = self._pending.pop(req_id, None)
        if fut is None:
            self.unmatched.append(reply)
            return
        status = terms.atom_name(result[0])
        if status == "ok":
            value = result[1]
            data = terms.binary_bytes(value)
            fut.set_result(data if data is not None else value)
        else:
            fut.set_exception(_port_error(result[1]))

    # -- sessions and chains (docs/sessions.md) ------------------------------

    def session_open(self, quota: int | None = None) -> "PortSession":
        opts = {} if quota is None else {"quota": quota}
        incarnation, session_id = self.call("session_open", opts)
        return PortSession(self, (incarnation, session_id))

    def chain(
        self, steps: list[dict], input: bytes = b"", returns: list[str] | None = None, session: "PortSession | None" = None,
        gas_limit: int | None = None,
    ) -> Any:
        """Steps run in one submission; the last output, or {name: bytes} for `returns` (gas_limit: docs/metering.md)."""
        opts: dict[str, Any] = {"input": input} if gas_limit is None else {"input": input, "gas_limit": gas_limit}
        if returns is not None:
            opts["return"] = list(returns)
        ref = session.ref if session is not None else terms.atom("undefined")
        return _named(self.call("chain", ref, [_step_term(s) for s in steps], opts))

    def _log(self, frame: Any) -> None:
        _, level, logger, message, meta = plain(frame)
        self.logs.append((level, logger, message, meta))
        levelno = logging.getLevelName(level.upper())
        logging.getLogger(logger).log(levelno if isinstance(levelno, int) else logging.WARNING, "%s", message)

    def close(self, timeout: float = 10.0) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def __enter__(self) -> "PortClient":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.close()


class PortSession:
    """A session on the port behind a PortClient: named buffers resident on its GPU."""

    def __init__(self, client: PortClient, ref: tuple[int, int]) -> None:
        self.client = client
        self.ref = ref

    def create(self, name: str, contents: int | bytes) -> None:
        """A buffer of `contents` bytes, or of that many zero bytes (an int)."""
        self.client.call("buffer_create", self.ref, name, contents)

    def write(self, name: str, offset: int, data: bytes) -> None:
        self.client.call("buffer_write", self.ref, name, offset, data)

    def read(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        return self.client.call("buffer_read", self.ref, name, offset, terms.atom("undefined") if length is None else length)

    def list(self) -> dict[str, int]:
        return _named(self.client.call("buffer_list", self.ref))

    def free(self, name: str) -> None:
        self.client.call("buffer_free", self.ref, name)

    def call(self, kernel_id: str, input: bytes = b"", **opts: Any) -> bytes:
        """One kernel in the session: input and output as a plain call, named buffers bound;
        {name: bytes} for a kernel that binds every buffer by name (docs/sessions.md)."""
        return _named(self.client.call("session_call", self.ref, kernel_id, input, _step_term(opts)))

    def chain(self, steps: list[dict], input: bytes = b"", returns: list[str] | None = None, gas_limit: int | None = None) -> Any:
        return self.client.chain(steps, input, returns, self, gas_limit)

    def close(self) -> None:
        self.client.call("session_close", self.ref)


def _step_term(step: dict) -> dict:
    """A step as the port reads it (str values travel as binaries, keys as atoms)."""
    return dict(step)


def _named(value: Any) -> Any:
    """Maps keyed by binaries come back with bytes keys; values as bytes."""
    if isinstance(value, dict):
        return {terms.binary_bytes(k).decode() if terms.binary_bytes(k) is not None else k: _plain(v) for k, v in value.items()}
    return value


def _plain(value: Any) -> Any:
    data = terms.binary_bytes(value)
    return data if data is not None else value


def _port_error(error: Any) -> PortError:
    reason, detail = error
    name = terms.atom_name(reason) or "?"
    if isinstance(detail, dict):
        fields = {terms.atom_name(k): v for k, v in detail.items()}
        return PortError(name, terms.binary_bytes(fields.get("detail")).decode(), fields.get("step"))
    return PortError(name, terms.binary_bytes(detail).decode())
