"""The one way the port answers: every reply, refusal and result goes down
through a Replies object to the frame writer (wire/framing.py).

Made once by the server, whole, and handed to each part that answers
(router, intake, the lone call's fold, group jobs, sessions, warm, test
hooks); none of them holds the router or calls back up into it
(docs/architecture.md, "Objects built whole").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from kem_port.errors import KemError, internal
from kem_port.gpu.calls import KernelCall
from kem_port.gpu.session.chain_plan import StepError
from kem_port.stats import Stats
from kem_port.transfer import shm
from kem_port.wire import terms
from kem_port.wire.framing import FrameWriter
from kem_port.wire.protocol import RequestError

log = logging.getLogger("kem_port.router")



class Replies:
    """Answers to the node, counted; see the module doc."""

    __slots__ = ("writer", "stats", "write_one", "write", "write_result", "gathered")

    def __init__(self, writer: FrameWriter, stats: Stats) -> None:
        self.writer, self.stats = writer, stats
        # The writer's own methods, bound once: the hot lone reply is one
        # attribute load and one call, as before this object existed.
        self.write_one: Callable[[bytes], None] = writer.write_one
        self.write: Callable[[list], None] = writer.write
        self.write_result: Callable[[int, bytes | memoryview], None] = writer.write_result
        self.gathered: Callable[[], AbstractContextManager] = writer.gathered

    def ok(self, req_id: Any, value: Any) -> None:
        """``{reply, ReqId, {ok, Value}}`` for any term value; a binary (a
        session step's or a chain's result) spliced as a kem@1.0 result is:
        erlang-py's encode of the reply took 5.1 us, the splice 0.4 (timeit,
        dev machine), a resident step's largest Python item after its kit."""
        if type(value) is bytes:
            self.write_result(req_id, value)
            return
        self.writer.write([terms.ok_reply(req_id, value)])

    def error(self, req_id: Any, error: KemError) -> None:
        """``{reply, ReqId, {error, {Reason, Detail}}}``, counted by reason; a
        chain step's as ``{error, {Reason, #{step => N, detail => Text}}}``,
        N counting from 1 as Erlang's ``lists:nth`` does (docs/sessions.md)."""
        self.stats.error(error.reason)
        if isinstance(error, StepError):
            self.writer.write([step_error_reply(req_id, error)])
            return
        self.writer.write([terms.error_reply(req_id, error.reason, error.detail)])

    def internal(self, req_id: Any) -> None:
        """An unexpected failure, logged by the caller: the node hears no internals."""
        self.error(req_id, internal())

    def answering(self, req_id: int, run: Callable[[], None]) -> None:
        """`run`, its failure answered to req_id (a RequestError to the ReqId
        it names), never raised: one request never takes the port down."""
        try:
            run()
        except RequestError as exc:
            self.error(exc.req_id, exc.error)
        except KemError as exc:
            self.error(req_id, exc)
        except Exception:
            log.exception("request %s failed", req_id)
            self.internal(req_id)

    def refuse_all(self, req_ids: list[int], error: KemError) -> None:
        """The same refusal to many callers, in one write."""
        with self.writer.gathered():
            for req_id in req_ids:
                self.error(req_id, error)

    def result(self, req_id: int, call: KernelCall, view: memoryview, gas: int | None = None) -> None:
        """A kernel call's result: in the reply, or into the shared-memory
        file the call named (the reply then carries only its size). A call
        that asked for its usage (``usage => true``) has its gas beside it:
        ``{ok, {Result, #{gas => G}}}`` (docs/metering.md)."""
        if call.output_path is None:
            if call.usage:
                self.writer.write(terms.ok_gas_reply(req_id, view, gas if gas is not None else 0))
                return
            self.writer.write_result(req_id, view)
            return
        try:
            shm.write_result(call.output_path, view)
        except KemError as exc:
            self.error(req_id, exc)
            return
        value = (terms.atom("shm"), call.output_path, len(view))
        self.writer.write([terms.ok_reply(req_id, with_gas(value, gas) if call.usage else value)])

    def node_sends_batches(self) -> None:
        """The peer has sent a calls or group frame (the node's kem_port.erl):
        from now on a step's small results may share a replies frame."""
        self.writer.batch_replies()


def with_gas(value: Any, gas: int | None) -> tuple:
    """The carrier of a call's usage (docs/metering.md): ``{Value, #{gas =>
    G}}``, which kem:request_usage/2 and its siblings take apart (kem_usage.erl).
    Any road may answer it to a call that asked (``usage => true``)."""
    return (value, {terms.atom("gas"): gas if gas is not None else 0})


def step_error_reply(req_id: Any, error: StepError) -> bytes:
    detail = {terms.atom("step"): error.step + 1, terms.atom("detail"): terms.Binary(error.detail.encode("utf-8", "replace"))}
    return terms.encode((terms.atom("reply"), req_id, (terms.atom("error"), (terms.atom(error.reason), detail))))
