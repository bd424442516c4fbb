"""Session and chain requests off the wire: shape checks and typed arguments.

A session travels as ``{Incarnation, SessionId}`` (the Erlang handle
carries both); buffer names as binaries or atoms; a chain step as a map
(docs/sessions.md). Every size is checked against the limits before
anything is allocated; kernel ids are resolved by the router.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kem_port.config import Config
from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.session.chain_plan import StepError
from kem_port.gpu.session.sessions import check_name
from kem_port.wire import protocol
from kem_port.wire.protocol import _entry_point, _grid, _kernel_id, _params, _workgroups, dispatch_given
from kem_port.wire.terms import atom_name, binary_bytes

SESSION_METHODS = (
    "session_open", "session_close", "buffer_create", "buffer_write", "buffer_read",
    "buffer_list", "buffer_free", "session_call", "chain",
)
MAX_STEPS = 256
STEP_KEYS = ("kernel", "params", "workgroups", "entry_point", "bind", "input", "output", "output_size", "grid")
CALL_OPTS = ("output_size", "params", "workgroups", "entry_point", "bind", "grid")
CHAIN_OPTS = ("input", "return")


@dataclass(frozen=True)
class StepArgs:
    """A step before its kernel is resolved."""

    kernel_id: str
    params: bytes | None
    workgroups: tuple[int, int, int] | None
    entry_point: str
    bind: dict[str, str]
    input: str | None
    output: str | None
    output_size: int | None
    grid: tuple[int, int, int] | None = None  # invocations (gpu/dispatch.py); not with workgroups


def session_ref(value: Any) -> tuple[int, int]:
    if not (isinstance(value, tuple) and len(value) == 2 and all(type(v) is int for v in value)):
        raise bad_args("a session is {Incarnation, SessionId}; pass the handle kem:session_open/1 returned")
    return value  # type: ignore[return-value]


def name(value: Any, what: str = "buffer name") -> str:
    text = atom_name(value)
    if text is None or isinstance(value, bool) or value is None:
        raw = binary_bytes(value)
        if raw is None:
            raise bad_args(f"{what} must be a binary or an atom")
        text = raw.decode("ascii", "replace")
    return check_name(text)


def binary(value: Any, what: str, config: Config) -> bytes:
    data = binary_bytes(value)
    if data is None:
        raise bad_args(f"{what} must be a binary")
    if len(data) > config.max_input_bytes:
        raise too_large(f"{what} of {len(data)} bytes is over KEM_MAX_INPUT_BYTES={config.max_input_bytes}")
    return data


def size(value: Any, what: str, config: Config, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:
        raise bad_args(f"{what} must be an integer >= {minimum}")
    if value > config.max_output_bytes:
        raise too_large(f"{what} {value} is over KEM_MAX_OUTPUT_BYTES={config.max_output_bytes}")
    return value


def arity(args: tuple, n: int, shape: str) -> None:
    if len(args) != n:
        raise bad_args(f"expected Args {shape}")


def options(value: Any, known: tuple[str, ...], what: str) -> dict[str, Any]:
    return protocol.options(value, known, what, f"{what} key")


def open_quota(args: tuple) -> int | None:
    arity(args, 1, "{Opts}")
    opts = options(args[0], ("quota",), "session option")
    quota = opts.get("quota")
    if quota is not None and (type(quota) is not int or quota < 4):
        raise bad_args("quota must be an integer >= 4 (bytes)")
    return quota


def bind_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise bad_args("bind must be a map #{WgslName => BufferName}")
    return {name(k, "bind key"): name(v, "bind value") for k, v in value.items()}


def step_args(value: Any, config: Config) -> StepArgs:
    opts = options(value, STEP_KEYS, "step")
    if "kernel" not in opts:
        raise bad_args("a step needs kernel => KernelId")
    return _step(opts, config)


def call_step(kernel: Any, data: bytes, opts_term: Any, config: Config) -> StepArgs:
    """session_call's one step: the call's input in, output_size bytes out
    (default: as many as the input)."""
    opts = options(opts_term, CALL_OPTS, "option")
    opts.setdefault("output_size", len(data))
    opts["kernel"] = kernel
    return _step(opts, config)


def _step(opts: dict[str, Any], config: Config) -> StepArgs:
    dispatch_given(opts.get("workgroups"), opts.get("grid"))
    return StepArgs(
        kernel_id=_kernel_id(opts["kernel"]),
        params=_params(opts["params"], config) if "params" in opts else None,
        workgroups=_workgroups(opts["workgroups"]) if "workgroups" in opts else None,
        entry_point=_entry_point(opts["entry_point"]) if "entry_point" in opts else "main",
        bind=bind_map(opts["bind"]) if "bind" in opts else {},
        input=name(opts["input"]) if "input" in opts else None,
        output=name(opts["output"]) if "output" in opts else None,
        output_size=size(opts["output_size"], "output_size", config) if "output_size" in opts else None,
        grid=_grid(opts["grid"]) if "grid" in opts else None,
    )


def chain_steps(value: Any, config: Config) -> list[StepArgs]:
    if not isinstance(value, list) or not value:
        raise bad_args("Steps must be a non-empty list of maps")
    if len(value) > MAX_STEPS:
        raise too_large(f"{len(value)} steps; a chain has at most {MAX_STEPS}")
    steps = []
    for index, step in enumerate(value):
        try:
            steps.append(step_args(step, config))
        except StepError:
            raise
        except KemError as exc:
            raise StepError(index, exc) from None
    return steps


def chain_opts(value: Any, config: Config) -> tuple[bytes, tuple[str, ...] | None]:
    opts = options(value, CHAIN_OPTS, "chain option")
    data = binary(opts["input"], "input", config) if "input" in opts else b""
    returns = None
    if "return" in opts:
        if not isinstance(opts["return"], list):
            raise bad_args("return must be a list of buffer names")
        returns = tuple(name(n) for n in opts["return"])
    return data, returns
