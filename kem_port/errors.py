"""The one error type every layer raises: a reason atom plus readable detail.

Everything that can go wrong for a caller becomes ``KemError(reason, detail)``
and is sent back as ``{error, {Reason, Detail}}``; docs/protocol.md lists the
reasons.
"""

from __future__ import annotations


class KemError(Exception):
    """A failure reported to the caller, never a crash of the port."""

    def __init__(self, reason: str, detail: str, step: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if step is None else f"{reason} at step {step}: {detail}")
        self.reason = reason
        self.detail = detail
        self.step = step  # a chain step's failure: its position, from 1 (docs/sessions.md)


def bad_args(detail: str) -> KemError:
    return KemError("bad_args", detail)


def too_large(detail: str) -> KemError:
    return KemError("too_large", detail)


def first_names(names: list[str], shown: int = 16) -> str:
    """Names for a refusal: the first `shown`, then how many more. A kernel
    admission takes may declare ~15k overrides or 2,000 entry points, and a
    reply that listed them all was 109 KB (red team 5)."""
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def internal() -> KemError:
    """An unexpected failure, logged where it happened: the caller hears no internals."""
    return KemError("internal", "internal error (details in the node's log)")
