"""The typed requests a frame is read into (wire/requests.py reads; the
port routes them): one definition each, imported by every reader."""

from __future__ import annotations

from typing import Any, NamedTuple

from kem_port.errors import KemError
from kem_port.gpu.calls import KernelCall


class KernelRequest(NamedTuple):
    """A kernel call, its arguments checked and typed; hot: read by the
    narrow reader (request_fast.hot_execute_kernel), so a plain call
    (bytes in, no params, options or file)."""

    req_id: int
    call: KernelCall
    deadline: float | None  # time.monotonic() when the node stops waiting
    timeout_s: float | None
    hot: bool


class MethodRequest(NamedTuple):
    req_id: int
    method: str
    args: tuple
    deadline: float | None


class GroupRequest(NamedTuple):
    group: Any  # a checked group_frames.Group (not imported: group_frames imports protocol, which imports request_fast, which imports this)


class CallsRequest(NamedTuple):
    requests: list


class Refused(NamedTuple):
    """Each of req_ids hears error (``[None]``: the frame names nobody it
    can be sure of); enveloped: a ``{call, ...}`` envelope was read whole
    (counted in ``calls``, as a request that was then refused); group: a
    group frame's fields were read whole and then refused by its checks
    (counted in ``group_frames``, and the peer reads replies frames)."""

    req_ids: list
    error: KemError
    enveloped: bool = False
    group: bool = False
