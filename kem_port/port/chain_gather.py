"""Stateless chains of one shape, queued together, answered from one
submission (gpu/session/chain_batch.py).

A chain without a session that repeats a kept shape goes to the GPU queue
with a gather key (its shape): the GPU loop takes those queued right
behind each other together (gpu_loop._gather), and they run on their own
kits in one submission, as a batch of kem@1.0 calls does. Their replies go
out in one write. A chain the batch cannot take (no kit to spare, a kit
that no longer fits) runs alone, on its own road.
"""

from __future__ import annotations

import logging
from typing import Any

from kem_port.errors import KemError, internal
from kem_port.gpu.session.chain import ChainResult
from kem_port.gpu.session.chain_batch import run_kits_together
from kem_port.port.replies import with_gas
from kem_port.wire.session_requests import ChainRequest

log = logging.getLogger("kem_port.sessions")


def answer_value(result: ChainResult, request: ChainRequest) -> Any:
    """A chain's answer: buffer names as binaries (a str key would become an
    atom), with the gas beside it when the caller asked (``usage => true``:
    ``{Result, #{gas => G}}``, docs/metering.md)."""
    value = {n.encode(): v for n, v in result.value.items()} if isinstance(result.value, dict) else result.value
    return with_gas(value, result.gas) if request.metering.usage else value


def gatherable(control: Any, batch: tuple, methods: Any) -> None:
    """Mark a queued chain control for the GPU loop to gather with others
    of its shape (``batch``: its shape and request)."""
    control.gather_key, control.batch = ("chain", batch[0]), batch
    control.gather = lambda executor, controls: run_gathered(methods, executor, controls)


def run_gathered(methods: Any, executor: Any, controls: list) -> None:
    """Answer every gathered chain (``methods``: port/session_methods.py's
    SessionMethods; each control carries ``batch``: its shape and request)."""
    key, requests = controls[0].batch[0], [control.batch[1] for control in controls]
    alone: list = []
    try:
        try:
            results = methods.service.run(
                lambda: run_kits_together(methods.service.chains, key, [(r.data, r.steps) for r in requests]))
        except KemError as exc:  # the submission failed: every chain in it
            results = [exc] * len(requests)
        except Exception:  # a bug must not leave a caller waiting
            log.exception("gathered chains failed")
            results = [internal()] * len(requests)
        with methods.replies.gathered():  # one writev for the batch's replies
            for control, request, result in zip(controls, requests, results):
                if result is None:
                    alone.append(control)
                elif isinstance(result, KemError):
                    methods.replies.error(request.req_id, result)
                else:
                    methods.replies.answering(request.req_id, lambda: methods.replies.ok(request.req_id, answer_value(result, request)))
    finally:
        methods.unqueue(len(controls) - len(alone))
    for control in alone:
        control(executor)  # its own road (it counts itself off the queue)
