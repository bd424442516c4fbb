"""Requests off the wire: shape checks and typed arguments.

``{call, ReqId, Method, Args}`` becomes a :class:`Call`; the arguments of the
kernel methods become a :class:`KernelCall`, with every untrusted size
checked against the configured limits before anything is allocated for it.
docs/protocol.md is the normative description.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kem_port.config import Config
from kem_port.errors import KemError, bad_args, too_large
from kem_port.gpu.calls import KernelCall
from kem_port.wire.request_fast import MAX_REQ_ID
from kem_port.wire.terms import atom_name, binary_bytes, shown, unknown_key

# Used with fullmatch: "$" also matches before a trailing newline.
KERNEL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
ENTRY_POINT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
PROTOCOL_VERSION = 4  # 3: calls and replies frames (batch_frames.py); 4: group frames (group_frames.py); answered by the `version` method; the node checks it at start-up
KERNEL_METHODS = ("execute_kernel", "execute_kernel_with_params", "execute")
INLINE_METHODS = ("ping", "hello", "version", "adapter_info", "health", "call_state", "stats", "config", "test_hook", "warm")
EXECUTE_OPTS = ("output_size_hint", "output_size", "params", "workgroups", "entry_point", "output_shm", "debug", "grid", "constants", "gas_limit", "usage")
# A kernel's overrides are few (the WebGPU samples declare 1-4); 64 bounds
# what a caller can make kem check and key its caches on.
MAX_CONSTANTS = 64
MAX_GAS = (1 << 63) - 1  # gas counts in 64 bits (the meter's two words plus invocations)


def version_info() -> dict:
    """What the `version` method answers: the node compares both at start-up."""
    from kem_port import __version__

    return {"package": __version__, "protocol": PROTOCOL_VERSION}


@dataclass(frozen=True)
class Call:
    req_id: int
    method: str
    args: tuple
    timeout_s: float | None = None  # the node's timeout for this call
    deadline: float | None = None  # time.monotonic() when the node stops waiting


def parse_call(term: Any) -> Call:
    """Check the envelope. A KemError raised here carries no usable ReqId.

    ``{call, ReqId, Method, Args, TimeoutMs}`` also carries the node's
    timeout for the call: the port answers ``timeout`` itself when the
    call's deadline passes while it is queued or fetching its kernel. (A
    plain integer: a one-key map cost ~3 us more to decode per call.)"""
    if not (isinstance(term, tuple) and len(term) in (4, 5) and atom_name(term[0]) == "call"):
        raise KemError("bad_request", "expected {call, ReqId, Method, Args} or {call, ReqId, Method, Args, TimeoutMs}")
    _, req_id, method, args = term[:4]
    if not (type(req_id) is int and 0 <= req_id <= MAX_REQ_ID):
        raise KemError("bad_request", "ReqId must be a non-negative integer below 2^64")
    name = atom_name(method)
    if name is None or isinstance(method, bool) or method is None:
        raise RequestError(req_id, bad_args("Method must be an atom"))
    if not isinstance(args, tuple):
        raise RequestError(req_id, bad_args("Args must be a tuple"))
    if len(term) == 4:
        return Call(req_id, name, args)
    timeout_s = _call_timeout(req_id, term[4])
    return Call(req_id, name, args, timeout_s, time.monotonic() + timeout_s)


def _call_timeout(req_id: int, value: Any) -> float:
    if type(value) is not int or not 0 < value <= MAX_REQ_ID:
        raise RequestError(req_id, bad_args("TimeoutMs must be an integer > 0"))
    return value / 1000.0


class RequestError(Exception):
    """A KemError that belongs to a known ReqId."""

    def __init__(self, req_id: int, error: KemError) -> None:
        super().__init__(str(error))
        self.req_id = req_id
        self.error = error


def _binary(value: Any, what: str) -> bytes:
    data = binary_bytes(value)
    if data is None:
        raise bad_args(f"{what} must be a binary")
    return data


def _kernel_id(value: Any) -> str:
    raw = _binary(value, "KernelId")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise bad_args("KernelId must be ASCII letters, digits, '-' or '_'") from None
    if not KERNEL_ID.fullmatch(text):
        raise KemError("invalid_kernel_id", f"{text[:80]!r}: use 1-128 letters, digits, '-' or '_'")
    return text


def _positive_int(value: Any, what: str, maximum: int) -> int:
    if type(value) is not int or value <= 0:
        raise bad_args(f"{what} must be an integer > 0")
    if value > maximum:
        raise too_large(f"{what} {value} is over the limit of {maximum}")
    return value


def shm_name(value: Any) -> bytes | list | None:
    """A `{shm, Name}` argument's name as transfer/shm.py takes it: a
    binary's bytes, a list of them (a payload in parts), else None."""
    if isinstance(value, list):
        return [binary_bytes(part) for part in value]
    return binary_bytes(value)


def _no_shm(value: Any) -> Any:
    raise bad_args("shared-memory transfer needs KEM_SHM_DIR and a binary path")


@dataclass(frozen=True)
class Shm:
    """How `{shm, Path}` arguments are read (shm.py): the protocol checks
    shapes only and never touches a file itself."""

    read_input: Callable[[Any], Any] = _no_shm  # bytes in memory, or the file(s) to read at encoding
    output_path: Callable[[Any], str | tuple[str, ...]] = _no_shm  # one file, or a slot's part files


NO_SHM = Shm()


def _input(value: Any, config: Config, shm: Shm) -> bytes | memoryview:
    if isinstance(value, tuple) and len(value) == 2 and atom_name(value[0]) == "shm":
        return shm.read_input(shm_name(value[1]))
    data = _binary(value, "Input")
    if len(data) > config.max_input_bytes:
        raise too_large(f"input of {len(data)} bytes is over KEM_MAX_INPUT_BYTES={config.max_input_bytes}")
    return data


def _params(value: Any, config: Config) -> bytes:
    data = _binary(value, "Params")
    if len(data) > config.max_params_bytes:
        raise too_large(f"params of {len(data)} bytes are over the {config.max_params_bytes}-byte uniform limit")
    if not data:
        raise bad_args("Params must not be empty")
    return data


def _output_size(input_len: int, hint: int, config: Config) -> int:
    size = input_len * hint
    if size > config.max_output_bytes:
        raise too_large(
            f"output of {input_len} x {hint} = {size} bytes is over KEM_MAX_OUTPUT_BYTES={config.max_output_bytes}"
        )
    return size


def _workgroups(value: Any) -> tuple[int, int, int]:
    if not (isinstance(value, tuple) and len(value) == 3 and all(type(v) is int for v in value)):
        raise bad_args("workgroups must be {X, Y, Z} of integers")
    if any(v <= 0 or v > MAX_REQ_ID for v in value):
        raise bad_args("workgroups must each be >= 1")
    return value  # type: ignore[return-value]


def _grid(value: Any) -> tuple[int, int, int]:
    """``grid => {X, Y, Z}`` invocations; checked as workgroups are (the
    device's per-dimension limit is checked once the workgroup size is known)."""
    if not (isinstance(value, tuple) and len(value) == 3 and all(type(v) is int for v in value)):
        raise bad_args("grid must be {X, Y, Z} of integers (invocations)")
    if any(v <= 0 or v > MAX_REQ_ID for v in value):
        raise bad_args("grid must each be >= 1")
    return value  # type: ignore[return-value]


def dispatch_given(workgroups: Any, grid: Any) -> None:
    if workgroups is not None and grid is not None:
        raise bad_args("give grid (invocations) or workgroups, not both")


def _constant_name(key: Any) -> str | None:
    name = atom_name(key)
    if name is None or isinstance(key, bool) or key is None:
        raw = binary_bytes(key)
        name = raw.decode("ascii", "replace") if raw is not None else None
    return name if name is not None and (ENTRY_POINT.fullmatch(name) or name.isdigit()) else None


def constants(value: Any) -> tuple[tuple[str, int | float], ...]:
    """``constants => #{Name => Number}``: WGSL override names (or an
    @id's digits) to integers or floats, sorted by name (a cache key).
    Whether the kernel declares them and their ranges: gpu/constants.py."""
    if not isinstance(value, dict):
        raise bad_args("constants must be a map #{Name => Number}")
    if len(value) > MAX_CONSTANTS:
        raise too_large(f"{len(value)} constants; at most {MAX_CONSTANTS}")
    named: dict[str, int | float] = {}
    for key, item in value.items():
        name = _constant_name(key)
        if name is None:
            raise bad_args(f"constants keys must be WGSL identifiers (atoms or binaries), not {shown(key)}")
        if type(item) not in (int, float):
            raise bad_args(f"constants value of {name} must be an integer or a float")
        if name in named:  # an atom and a binary of one text: two keys in Erlang, one value kept (red team)
            raise bad_args(f"constants: {name} given twice")
        named[name] = item
    return tuple(sorted(named.items()))


def _entry_point(value: Any) -> str:
    name = atom_name(value)
    if name is None:
        raw = binary_bytes(value)
        name = raw.decode("ascii", "replace") if raw is not None else None
    if name is None or not ENTRY_POINT.fullmatch(name):
        raise bad_args("entry_point must be a WGSL identifier (atom or binary)")
    return name


def _arity(args: tuple, n: int, shape: str) -> None:
    if len(args) != n:
        raise bad_args(f"expected Args {shape}")


def kernel_call(method: str, args: tuple, config: Config, shm: Shm = NO_SHM) -> KernelCall:
    if method == "execute_kernel":
        usage = len(args) == 4 and atom_name(args[3]) == "usage"  # its gas beside the result (docs/metering.md)
        _arity(args[:3] if usage else args, 3, "{KernelId, Input, OutputSizeHint} (or with usage last)")
        kid, data = _kernel_id(args[0]), _input(args[1], config, shm)
        hint = _positive_int(args[2], "OutputSizeHint", config.max_output_bytes)
        return KernelCall(kid, data, _output_size(len(data), hint, config), usage=usage)
    if method == "execute_kernel_with_params":
        _arity(args, 3, "{KernelId, Input, Params}")
        kid, data = _kernel_id(args[0]), _input(args[1], config, shm)
        params = _params(args[2], config)
        return KernelCall(kid, data, _output_size(len(data), 1, config), params=params)
    if method == "execute":
        _arity(args, 3, "{KernelId, Input, Opts}")
        kid, data = _kernel_id(args[0]), _input(args[1], config, shm)
        return _execute_opts(kid, data, args[2], config, shm)
    raise KemError("unknown_method", method)


def options(value: Any, known: tuple[str, ...], map_name: str, key_name: str) -> dict[str, Any]:
    """A map of atom keys, each one of `known`, by key name; bad_args
    naming the map (`map_name`) or the unknown key (`key_name`) otherwise."""
    if not isinstance(value, dict):
        raise bad_args(f"{map_name} must be a map")
    named: dict[str, Any] = {}
    for key, item in value.items():
        name = atom_name(key)
        if name not in known:
            raise bad_args(unknown_key(key, known, key_name))
        named[name] = item
    return named


def _execute_opts(kid: str, data: bytes | memoryview, opts: Any, config: Config, shm: Shm) -> KernelCall:
    named = options(opts, EXECUTE_OPTS, "Opts", "option")
    if "output_size" in named and "output_size_hint" in named:
        raise bad_args("give output_size or output_size_hint, not both")
    if "output_size" in named:
        size = named["output_size"]
        if type(size) is not int or size < 0:
            raise bad_args("output_size must be an integer >= 0")
        if size > config.max_output_bytes:
            raise too_large(f"output_size {size} is over KEM_MAX_OUTPUT_BYTES={config.max_output_bytes}")
    else:
        hint = _positive_int(named.get("output_size_hint", 1), "output_size_hint", config.max_output_bytes)
        size = _output_size(len(data), hint, config)
    params = _params(named["params"], config) if "params" in named else None
    groups = _workgroups(named["workgroups"]) if "workgroups" in named else None
    grid = _grid(named["grid"]) if "grid" in named else None
    dispatch_given(groups, grid)
    overrides = constants(named["constants"]) if "constants" in named else None
    entry = _entry_point(named["entry_point"]) if "entry_point" in named else "main"
    out_path = shm.output_path(shm_name(named["output_shm"])) if "output_shm" in named else None
    debug = named.get("debug", False)
    if debug is not True and debug is not False:
        raise bad_args("debug must be true or false")
    if debug:
        out_path = None  # a debug call answers in the reply, records beside the result
    gas = _positive_int(named["gas_limit"], "gas_limit", MAX_GAS) if "gas_limit" in named else None
    usage = named.get("usage", False)  # the node asks for the call's gas beside its result (docs/metering.md)
    if usage is not True and usage is not False:
        raise bad_args("usage must be true or false")
    return KernelCall(kid, data, size, params, groups, entry, out_path, debug, grid, overrides, gas, usage)
