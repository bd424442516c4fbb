"""Session and chain requests off the wire: shape checks and typed arguments.

A session travels as ``{Incarnation, SessionId}`` (the Erlang handle
carries both); buffer names as binaries or atoms; a chain step as a map:
a kernel step, ``#{copy => {Src, SrcOffset, Dst, DstOffset, Size}}`` or
``#{clear => {Buffer, Offset, Size}}`` (docs/sessions.md). Every size is checked against the limits before
anything is allocated; kernel ids are resolved by the router.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kem_port.config import Config
from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.constants import set_key
from kem_port.gpu.session.chain_steps import ClearStep, CopyStep, StepError
from kem_port.gpu.session.sessions import check_name
from kem_port.wire import protocol
from kem_port.wire.protocol import (
    MAX_GAS, _entry_point, _grid, _kernel_id, _params, _positive_int, _workgroups, constants, dispatch_given,
)
from kem_port.wire.narrow_decode import CachedAtom
from kem_port.wire.terms import Atom, Binary, atom_name, binary_bytes

SESSION_METHODS = (
    "session_open", "session_close", "buffer_create", "buffer_write", "buffer_read",
    "buffer_list", "buffer_free", "session_call", "chain",
)
MAX_STEPS = 256
MAX_STEP_BUFFERS = 64  # a step's own buffers: far over WebGPU's 8 storage + 12 uniform buffers a stage
STEP_KEYS = ("kernel", "params", "workgroups", "entry_point", "bind", "input", "output", "output_size", "grid",
             "constants", "buffers", "outputs")
# gas_limit and usage are the call's or the whole chain's, not a step's (gpu/session/chain_gas.py)
CALL_OPTS = ("output_size", "params", "workgroups", "entry_point", "bind", "grid", "constants", "buffers", "outputs",
             "gas_limit", "usage")
CHAIN_OPTS = ("input", "return", "gas_limit", "usage", "max_bytes")


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
    constants: tuple[tuple[str, int | float], ...] | None = None  # pipeline constants (gpu/constants.py)
    buffers: dict[str, bytes] = field(default_factory=dict)  # the step's own bytes, by WGSL name
    outputs: dict[str, int] = field(default_factory=dict)  # new buffers by name: their sizes


def shape_key(step: StepArgs | CopyStep | ClearStep) -> tuple | CopyStep | ClearStep:
    """A step's shape: all of it but its bytes' contents (params and its
    own buffers by length), the key of a chain's kit (gpu/session/chain_kit.py).
    Constants by set_key: 0.0 and -0.0 are equal in Python, not in WGSL."""
    if type(step) is not StepArgs:
        return step  # copy and clear steps: frozen, their fields are their shape
    return (step.kernel_id, -1 if step.params is None else len(step.params), step.workgroups, step.entry_point,
            tuple(step.bind.items()), step.input, step.output, step.output_size, step.grid,
            set_key(step.constants) if step.constants else None,
            tuple((k, len(v)) for k, v in step.buffers.items()), tuple(step.outputs.items()))


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


_SAME_TYPES = (Binary, int, Atom, CachedAtom)


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


def step_args(value: Any, config: Config) -> StepArgs | CopyStep | ClearStep:
    opts = options(value, STEP_KEYS + ("copy", "clear"), "step")
    for kind in ("copy", "clear"):
        if kind in opts:
            if len(opts) > 1:
                raise bad_args(f"a {kind} step is #{{{kind} => {{...}}}} alone; it has no {sorted(set(opts) - {kind})[0]}")
            return _copy(opts[kind], config) if kind == "copy" else _clear(opts[kind], config)
    if "kernel" not in opts:
        raise bad_args("a step needs kernel => KernelId (or is #{copy => ...} or #{clear => ...})")
    return _step(opts, config)


def _copy(value: Any, config: Config) -> CopyStep:
    if not (isinstance(value, tuple) and len(value) == 5):
        raise bad_args("copy is {Src, SrcOffset, Dst, DstOffset, Size}: names and byte counts")
    src, src_offset, dst, dst_offset, count = value
    return CopyStep(name(src), size(src_offset, "copy source offset", config), name(dst),
                    size(dst_offset, "copy destination offset", config), size(count, "copy size", config))


def _clear(value: Any, config: Config) -> ClearStep:
    if not (isinstance(value, tuple) and len(value) == 3):
        raise bad_args("clear is {Buffer, Offset, Size}: a name and byte counts")
    buffer, offset, count = value
    return ClearStep(name(buffer), size(offset, "clear offset", config), size(count, "clear size", config))


def _named_map(value: Any, what: str, read) -> dict:
    if not isinstance(value, dict):
        raise bad_args(f"{what} must be a map #{{Name => ...}}")
    if len(value) > MAX_STEP_BUFFERS:
        raise too_large(f"{len(value)} {what}; at most {MAX_STEP_BUFFERS}")
    named = {}
    for key, item in value.items():
        text = name(key, f"{what} key")
        if text in named:
            raise bad_args(f"{what} gives {text!r} twice")
        named[text] = read(item, text)
    return named


def _step_buffers(value: Any, config: Config) -> dict[str, bytes]:
    found = _named_map(value, "buffers", lambda v, k: binary(v, f"buffer {k!r}", config))
    total = sum(map(len, found.values()))
    if total > config.max_input_bytes:
        raise too_large(f"buffers of {total} bytes are over KEM_MAX_INPUT_BYTES={config.max_input_bytes}")
    return found


@dataclass(frozen=True)
class Metering:
    """A call's or chain's budgets and gas options (docs/metering.md)."""

    gas_limit: int | None = None  # the whole chain's budget; None: the node's KEM_GAS_LIMIT
    usage: bool = False  # answer {Result, #{gas => G}} (port/replies.with_gas)
    # A chain's bytes and work, below the port's own KEM_MAX_OUTPUT_BYTES: the
    # node's request budget (kem:request_chain_usage/2 sends it for dev_kem),
    # counted here exactly on the planned chain (gpu/session/chain_budget.py).
    max_bytes: int | None = None


def call_step(kernel: Any, data: bytes, opts_term: Any, config: Config) -> tuple[StepArgs, Metering]:
    """session_call's one step (the call's input in, output_size bytes out,
    by default as many as the input: chain_plan's default for a first
    step) and the call's gas options."""
    opts = options(opts_term, CALL_OPTS, "option")
    metering = _metering(opts.pop("gas_limit", None), opts.pop("usage", False))
    opts["kernel"] = kernel
    return _step(opts, config), metering


def _metering(limit: Any, usage: Any) -> Metering:
    """gas_limit checked as execute's is (wire/protocol.py), usage a boolean."""
    if usage is not True and usage is not False:
        raise bad_args("usage must be true or false")
    return Metering(None if limit is None else _positive_int(limit, "gas_limit", MAX_GAS), usage)


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
        constants=constants(opts["constants"]) if "constants" in opts else None,
        buffers=_step_buffers(opts["buffers"], config) if "buffers" in opts else {},
        outputs=_named_map(opts["outputs"], "outputs", lambda v, k: size(v, f"output {k!r}", config)) if "outputs" in opts else {},
    )


def chain_steps(value: Any, config: Config) -> list[StepArgs | CopyStep | ClearStep]:
    if not isinstance(value, list) or not value:
        raise bad_args("Steps must be a non-empty list of maps")
    if len(value) > MAX_STEPS:
        raise too_large(f"{len(value)} steps; a chain has at most {MAX_STEPS}")
    steps, seen = [], {}
    for index, step in enumerate(value):
        key = _same_as(step)
        found = seen.get(key) if key is not None else None
        if found is None:
            try:
                found = step_args(step, config)
            except StepError:
                raise
            except KemError as exc:
                raise StepError(index, exc) from None
            if key is not None:
                seen[key] = found
        steps.append(found)
    return steps


def _same_as(step: Any) -> frozenset | None:
    """A step map of atoms, binaries and integers as a key, each value with
    its type (true == 1 in Python): a chain's repeated steps (ten `double`s)
    are read once. Reading a step cost ~3.5 us; 34% of a loaded H100 port's
    reader at 64 callers of 10-step chains went to chain_steps (py-spy).
    None for any other step (tuples, maps, floats): read each time."""
    if type(step) is not dict or len(step) > 4:
        return None
    items = []
    for key, item in step.items():
        kind = type(item)
        if kind not in _SAME_TYPES:
            return None
        # A binary by its bytes: erlang-py hashes and compares one by encoding
        # it again each time (28 encodes for ten `double` steps; chain_steps
        # on them 21 -> 10 us, timeit on the dev machine, docs/codec.md).
        key_kind = type(key)
        items.append((key_kind, (key.value, key.bits) if key_kind is Binary else key,
                      kind, (item.value, item.bits) if kind is Binary else item))
    return frozenset(items)


def chain_opts(value: Any, config: Config) -> tuple[bytes, tuple[str, ...] | None, Metering]:
    opts = options(value, CHAIN_OPTS, "chain option")
    gas = _metering(opts.get("gas_limit"), opts.get("usage", False))
    if "max_bytes" in opts:  # a node's budget over the port's own is the port's
        limit = opts["max_bytes"]
        if type(limit) is not int or limit < 0:
            raise bad_args("max_bytes must be an integer >= 0 (bytes)")
        gas = replace(gas, max_bytes=min(limit, config.max_output_bytes))
    data = binary(opts["input"], "input", config) if "input" in opts else b""
    returns = None
    if "return" in opts:
        if not isinstance(opts["return"], list):
            raise bad_args("return must be a list of buffer names")
        returns = tuple(name(n) for n in opts["return"])
    return data, returns, gas
