"""Every frame read once, into a typed request: the port's one decode.

A frame's bytes are read here and nowhere after. What comes out is one of

- :class:`KernelRequest`: a kernel call, its arguments checked and typed
  (``KernelCall``), with the node's deadline;
- a session or chain method, its arguments checked
  (:class:`BufferRequest`, :class:`ChainRequest`, session_requests.py);
- :class:`MethodRequest`: any other method (the quick ones), its envelope
  checked;
- :class:`GroupRequest`: a group frame's N calls, checked once
  (group_frames.py);
- :class:`CallsRequest`: a calls frame's requests, each read as above
  (batch_frames.py);
- :class:`Refused`: what a frame that could not be read answers, and to
  whom.

Readers, narrowest first: the hot ``execute_kernel`` shape straight off
its bytes (request_fast.hot_execute_kernel; 2.5 against 5.7 us through
erlang-py, terms.py), a group frame's fields (group_frames.read_fields),
then the bounded walk and erlang-py (terms.decode_request). Each gives the
same typed request for the same frame; a frame one reader leaves is read
by the next, never twice by one.
"""

from __future__ import annotations

import logging
from typing import Any, Union

from kem_port.config import Config
from kem_port.errors import KemError, internal
from kem_port.wire import group_frames, terms
from kem_port.wire.batch_frames import split_calls
from kem_port.wire.protocol import KERNEL_METHODS, RequestError, Shm, kernel_call, parse_call
from kem_port.wire.request_fast import hot_execute_kernel
from kem_port.wire.request_types import CallsRequest, GroupRequest, KernelRequest, MethodRequest, Refused
from kem_port.wire.session_protocol import SESSION_METHODS
from kem_port.wire.run_requests import RunRequest, read_run
from kem_port.wire.session_requests import BufferRequest, ChainRequest, read_session

log = logging.getLogger("kem_port.router")


Request = Union[KernelRequest, RunRequest, BufferRequest, ChainRequest, MethodRequest, GroupRequest, CallsRequest, Refused]


class RequestReader:
    """Frames into typed requests, within one port's limits."""

    def __init__(self, config: Config, shm: Shm) -> None:
        self.config, self.shm = config, shm

    def read(self, frame: bytes) -> Request:
        """The typed request a frame holds; never raises."""
        hot = hot_execute_kernel(frame, self.config)
        if hot is not None:
            return hot
        items = split_calls(frame)  # None: not a well-formed calls frame, read as one request (and refused)
        if items is not None:
            return CallsRequest([self._one(item) for item in items])
        return self._one(frame, tried_hot=True)

    def _one(self, frame: bytes, tried_hot: bool = False) -> Request:
        req_id: Any = None
        try:
            if group_frames.is_group_frame(frame):
                return self._group(group_frames.read_fields(frame) or self._group_term(frame))
            if not tried_hot and (hot := hot_execute_kernel(frame, self.config)) is not None:
                return hot
            term = terms.decode_request(frame)
            fields = group_frames.fields_of_term(term)  # a group frame in another spelling
            if fields is not None:
                return self._group(fields)
            call = parse_call(term)
            req_id = call.req_id
            if call.method in KERNEL_METHODS:
                kcall = kernel_call(call.method, call.args, self.config, self.shm)
                return KernelRequest(req_id, kcall, call.deadline, call.timeout_s, False)
            if call.method in SESSION_METHODS:
                return read_session(req_id, call.method, call.args, self.config)
            if call.method == "run":  # a kernel by named buffers (run_requests.py)
                return read_run(req_id, call.args, self.config, call.deadline, call.timeout_s)
            return MethodRequest(req_id, call.method, call.args, call.deadline)
        except RequestError as exc:
            return Refused([exc.req_id], exc.error, req_id is not None)
        except KemError as exc:  # a refused frame may name its ReqId (etf_guard)
            if req_id is not None:
                return Refused([req_id], exc, True)
            return Refused([getattr(exc, "req_id", None)], exc)
        except Exception:  # never let one frame take the port down
            log.exception("internal error")
            return Refused([req_id], internal(), req_id is not None)

    def _group_term(self, frame: bytes) -> group_frames.GroupFields:
        """A group frame the narrow reader does not take, through erlang-py."""
        fields = group_frames.fields_of_term(terms.decode_request(frame))
        if fields is None:
            raise KemError("bad_request", "expected {group, KernelId, Hint, Entries, Inputs}")
        return fields

    def _group(self, fields: group_frames.GroupFields) -> GroupRequest | Refused:
        try:
            return GroupRequest(group_frames.check(fields, self.config))
        except group_frames.GroupRefused as exc:
            return Refused(exc.req_ids, exc.error, group=True)
        except KemError as exc:  # its Entries name no caller: answered to undefined
            return Refused([None], exc, group=True)
