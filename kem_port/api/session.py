"""Sessions and chains from Python (docs/sessions.md), numpy in and out.

A session keeps named buffers on one port's GPU between calls, so it needs
a port: :class:`Port` starts the real port process (``python -m kem_port``)
and drives it through :class:`kem_port.client.PortClient`, as a node's
``kem_port`` owner does. :func:`local_port` is one shared such port,
started on first use. A :class:`Session` remembers each buffer's dtype and
shape as it was put, so a read gives back the array that went in::

    with api.Session() as s:
        s.put("x", np.arange(8, dtype=np.float32))
        s.read("x")              # float32, shape (8,)

Chain steps are dicts as the port reads them (kernel steps, ``copy`` and
``clear`` steps, any later kind): arrays become bytes, ``params`` lists
become u32 words, an ``outputs`` entry may be ``(shape, dtype)``; every
other value travels unchanged, so a step kind the port learns works here
without a change to this module.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kem_port.api.values import Input, array_of, gpu_order, input_bytes, params_bytes, shape_output
from kem_port.client import PortClient, PortSession, plain
from kem_port.errors import bad_args
from kem_port.wire import terms

Kind = tuple[np.dtype, tuple[int, ...]]  # how a buffer's bytes read back


class Port:
    """A local port process; a context manager. ``env`` adds ``KEM_*``
    settings to this process's environment for the port."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.client = PortClient(dict(env or {}))

    def session(self, quota: int | None = None) -> "Session":
        """A new session on this port (``kem:session_open/1``)."""
        return Session(self, quota=quota)

    def chain(self, steps: Sequence[Mapping[str, Any]], input: Input = b"", returns: Sequence[str] | None = None,
              dtype: Any = None) -> Any:
        """A chain without a session (``kem:chain/2``): the last output, or
        ``{name: array}`` for ``returns``; see :meth:`Session.chain`."""
        return _chain(self.client.chain, steps, input, returns, dtype, {})

    def health(self) -> dict[str, Any]:
        """The port's ``health`` answer: usable, adapter, kind, backend, reason."""
        return plain(self.client.call("health"))

    def stats(self) -> dict[str, Any]:
        """The port's counters (``kem:stats()`` for one port)."""
        return plain(self.client.call("stats"))

    def close(self) -> None:
        if self.client.proc.poll() is None:
            self.client.close()

    def __enter__(self) -> "Port":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: Port | None = None
_shared_lock = threading.Lock()


def local_port() -> Port:
    """The shared local port, started on first use and closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.client.proc.poll() is not None:
            _shared = Port()
            atexit.register(_shared.close)
        return _shared


class Session:
    """Named buffers resident on a port's GPU; a context manager that closes
    the session. ``port`` defaults to :func:`local_port`; ``quota`` (bytes)
    may ask for less than ``KEM_SESSION_QUOTA_BYTES``."""

    def __init__(self, port: Port | None = None, quota: int | None = None) -> None:
        self.port = port or local_port()
        self._session: PortSession = self.port.client.session_open(quota)
        self._kinds: dict[str, Kind] = {}
        self._closed = False

    def put(self, name: str, value: Input) -> None:
        """A new buffer holding an array's (or bytes') contents; reads give
        back its dtype and shape. Sizes are whole 4-byte words."""
        self._session.create(name, input_bytes(value))
        self._kinds[name] = _kind_of(value)

    def zeros(self, name: str, shape: int | Sequence[int], dtype: Any = np.uint8) -> None:
        """A new buffer of zeros, read back as ``shape`` of ``dtype``."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        self._session.create(name, int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize)
        self._kinds[name] = (np.dtype(dtype), dims)

    def write(self, name: str, value: Input, offset: int = 0) -> None:
        """Overwrite bytes of a buffer from ``offset`` (bytes)."""
        self._session.write(name, offset, input_bytes(value))

    def read(self, name: str, dtype: Any = None, shape: Sequence[int] | None = None,
             offset: int = 0, length: int | None = None) -> np.ndarray:
        """A buffer (or ``length`` bytes from ``offset``) as an array: the
        dtype and shape it was put with, unless given; a range is flat."""
        data = self._session.read(name, offset, length)
        kind = self._kinds.get(name)
        whole = offset == 0 and length is None
        if dtype is None:
            dtype = kind[0] if kind else np.uint8
        if shape is None and whole and kind and np.dtype(dtype) == kind[0]:
            shape = kind[1]
        return array_of(data, dtype, shape)

    def buffers(self) -> dict[str, int]:
        """Every buffer's name and size in bytes."""
        return dict(self._session.list())

    def free(self, name: str) -> None:
        self._session.free(name)
        self._kinds.pop(name, None)

    def call(self, kernel: str, input: Input = b"", *, dtype: Any = None, out_shape: Sequence[int] | None = None,
             **options: Any) -> Any:
        """One kernel in the session (``kem:session_call/4``); ``options`` as
        a chain step takes them. A kem@1.0-shaped kernel's output comes back
        as :func:`kem_port.api.run` shapes it; any other kernel's as
        ``{name: array}`` of what its ``outputs`` made and its in/out buffers."""
        step, specs = to_step(options)
        got = self._session.call(kernel, input_bytes(input), **step)
        return _answer(got, input, dtype, out_shape, {**self._kinds, **specs})

    def chain(self, steps: Sequence[Mapping[str, Any]], input: Input = b"", returns: Sequence[str] | None = None,
              dtype: Any = None) -> Any:
        """Steps in one submission (``kem:chain/2`` with ``session => S``):
        the last output (shaped as :meth:`call` shapes it), or ``{name:
        array}`` for ``returns``, each as it was put or as ``outputs`` sized it.
        A failing step raises KemError whose ``.step`` counts from 1."""
        return _chain(self._session.chain, steps, input, returns, dtype, self._kinds)

    def close(self) -> None:
        """Close the session; its buffers go back to the port's pool. A
        second close does nothing, as a file's (a `with` block may close it)."""
        if not self._closed:
            self._closed = True
            self._session.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def to_step(step: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Kind]]:
    """A step as the client sends it, and the kinds of the buffers it names
    (``outputs`` given as ``(shape, dtype)``, in/out ``buffers`` arrays)."""
    out: dict[str, Any] = {}
    kinds: dict[str, Kind] = {}
    for key, value in step.items():
        if key == "params" and value is not None:
            out[key] = params_bytes(value)
        elif key == "outputs" and isinstance(value, Mapping):
            out[key] = {name: _output_size(name, spec, kinds) for name, spec in value.items()}
        elif key == "buffers" and isinstance(value, Mapping):
            kinds.update({name: _kind_of(v) for name, v in value.items() if isinstance(v, np.ndarray)})
            out[key] = {name: _plain_value(v) for name, v in value.items()}
        else:
            out[key] = _plain_value(value)
    return out, kinds


def _chain(send: Any, steps: Sequence[Mapping[str, Any]], input: Input, returns: Sequence[str] | None,
           dtype: Any, kinds: Mapping[str, Kind]) -> Any:
    made: dict[str, Kind] = dict(kinds)
    plain_steps = []
    for step in steps:
        sent, specs = to_step(step)
        plain_steps.append(sent)
        made.update(specs)
    got = send(plain_steps, input_bytes(input), None if returns is None else list(returns))
    return _answer(got, input, dtype, None, made)


def _answer(got: Any, input: Input, dtype: Any, out_shape: Sequence[int] | None, kinds: Mapping[str, Kind]) -> Any:
    if isinstance(got, (bytes, bytearray)):
        return shape_output(bytes(got), input, dtype, out_shape)
    named = {_name(k): _bytes(v) for k, v in dict(got).items()}
    return {name: array_of(data, *kinds.get(name, (np.uint8, None))) for name, data in named.items()}


def _output_size(name: str, spec: Any, kinds: dict[str, Kind]) -> int:
    if isinstance(spec, int):
        return spec
    try:
        shape, dtype = spec
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
    except (TypeError, ValueError):
        raise bad_args(f"outputs[{name!r}]: a byte count or (shape, dtype)") from None
    kinds[name] = (np.dtype(dtype), dims)
    return int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize


def _kind_of(value: Input) -> Kind:
    if isinstance(value, np.ndarray):
        return value.dtype, tuple(value.shape)
    return np.dtype(np.uint8), (len(bytes(value)),)


def _plain_value(value: Any) -> Any:
    """Arrays become their bytes, at any depth; everything else as given."""
    if isinstance(value, np.ndarray):
        return gpu_order(value).tobytes()
    if isinstance(value, Mapping):
        return {k: _plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_value(v) for v in value)
    return value


def _name(key: Any) -> str:
    data = terms.binary_bytes(key)
    if data is not None:
        return data.decode()
    return terms.atom_name(key) or str(key)


def _bytes(value: Any) -> bytes:
    data = terms.binary_bytes(value)
    return data if data is not None else bytes(value)
