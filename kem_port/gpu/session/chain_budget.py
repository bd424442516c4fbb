"""One request's budget for a whole chain (docs/sessions.md, "Budgets").

A chain is one request, so what it may allocate and dispatch is bounded
like one call's, not once per step (64 steps each within a 16 MiB output
budget grew a port by 1 GB; one step with ``workgroups`` {65535, 65535,
64} held a port until its caller's timeout):

* **bytes**: every temporary a step makes and every session buffer the
  chain returns count against ``KEM_MAX_OUTPUT_BYTES``, the output a
  call may have; the chain's input counts against ``KEM_MAX_INPUT_BYTES``
  as a call's does (session_protocol.py). Checked step by step while the
  chain is planned, before any buffer is taken.
* **work**: a step's workgroups (X*Y*Z) are bounded by what kem's own
  dispatch rule gives the largest output a call may have (one invocation
  per 4-byte word: ``ceil(words / invocations per workgroup)``), and the
  chain's invocations in total by CHAIN_CALLS such outputs.
"""

from __future__ import annotations

from kem_port.errors import bad_args, too_large
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint

# A chain may do the work of this many largest calls: a 256-step session
# chain of life on a 1024x1024 grid is 256 x 2^20 invocations, 16 of the
# default budget's 2^26; what takes longer belongs in several requests.
CHAIN_CALLS = 16
MAX_INVOCATIONS_PER_WORKGROUP = 256  # WebGPU's default maxComputeInvocationsPerWorkgroup


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class ChainBudget:
    """The running totals of one chain being planned."""

    def __init__(self, max_bytes: int, source: str = "KEM_MAX_OUTPUT_BYTES") -> None:
        self.max_bytes, self.source = max_bytes, source  # source: the setting the budget comes from
        self.max_words = _ceil_div(max_bytes, 4)  # invocations of the largest call
        self.bytes = 0
        self.invocations = 0

    def add_bytes(self, size: int, what: str) -> None:
        """A temporary (or returned session buffer) of `size` bytes."""
        self.bytes += size
        if self.bytes > self.max_bytes:
            raise too_large(f"{what} of {size} bytes brings the chain's buffers to {self.bytes} bytes, "
                            f"over one request's budget of {self.max_bytes} ({self.source})")

    def add_dispatch(self, entry: EntryPoint | None, groups: tuple[int, int, int]) -> None:
        """A step's dispatch: its workgroups, then the chain's invocations."""
        per_group = _invocations(entry)
        workgroups = groups[0] * groups[1] * groups[2]
        step_limit = _ceil_div(self.max_words, per_group)
        if workgroups > step_limit:
            raise bad_args(f"workgroups {tuple(groups)} are {workgroups} in all, over {step_limit}: the most "
                           f"kem's dispatch rule gives the largest output ({self.max_bytes} bytes) at {per_group} invocations each")
        self.invocations += workgroups * per_group
        # A call launches at least one workgroup, whatever its bytes: a budget of
        # a few bytes (the node's, max_bytes) still allows CHAIN_CALLS of them.
        chain_limit = CHAIN_CALLS * max(self.max_words, MAX_INVOCATIONS_PER_WORKGROUP)
        if self.invocations > chain_limit:
            raise bad_args(f"the chain's dispatches reach {self.invocations} invocations at this step, over {chain_limit} "
                           f"({CHAIN_CALLS} times the largest call's); split the chain into several requests")


def _invocations(entry: EntryPoint | None) -> int:
    """Invocations per workgroup; when kem cannot read the size (a
    constant), the most WebGPU's default limits allow, so the bound errs
    strict, never generous."""
    if entry is None or entry.workgroup_size is None:
        return MAX_INVOCATIONS_PER_WORKGROUP
    x, y, z = entry.workgroup_size
    return max(x * y * z, 1)
