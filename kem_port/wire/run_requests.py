"""The ``run`` method read into a typed request: a kernel called by named
buffers (issue 25; gpu/named/binding_model.py binds them).

``{call, ReqId, run, {KernelId, Buffers, Opts}, TimeoutMs}``: Buffers maps
a WGSL variable name (binary or atom), ``<<"G/B">>`` or a binding number
(group 0) to its bytes; Opts may hold ``outputs => #{Name => Bytes}``,
``workgroups => {X, Y, Z}`` or ``grid => {X, Y, Z}``, ``entry_point``,
``constants => #{Name => Number}``, ``gas_limit`` (the call's gas budget,
1..2^63-1, as execute's: docs/metering.md) and ``usage => true`` (the
reply carries the run's gas: ``{Outputs, #{gas => G}}``, port/replies.py). Every size is checked here,
before anything is allocated: the inputs together within
KEM_MAX_INPUT_BYTES, the outputs together within KEM_MAX_OUTPUT_BYTES.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from kem_port.config import Config
from kem_port.errors import bad_args, too_large
from kem_port.gpu.named.binding_model import NamedCall
from kem_port.wire.protocol import MAX_GAS, _binary, _entry_point, _grid, _kernel_id, _positive_int, _workgroups, constants, options
from kem_port.wire.terms import atom_name, binary_bytes, shown

MAX_BUFFERS = 64  # far over WebGPU's 8 storage + 12 uniform buffers a stage: a bound before the kernel is read
RUN_OPTS = ("outputs", "workgroups", "grid", "entry_point", "constants", "gas_limit", "usage")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}|[0-3]/[0-9]{1,4}|[0-9]{1,4}")


class RunRequest(NamedTuple):
    req_id: int
    call: NamedCall
    deadline: float | None
    timeout_s: float | None
    usage: bool = False  # the node asks for the run's gas beside its outputs


def read_run(req_id: int, args: Any, config: Config, deadline: float | None, timeout_s: float | None) -> RunRequest:
    if not (isinstance(args, tuple) and len(args) == 3):
        raise bad_args("expected Args {KernelId, Buffers, Opts}")
    kernel_id = _kernel_id(args[0])
    buffers = _named_map(args[1], "Buffers", lambda v, k: _binary(v, f"buffer {k!r}"))
    opts = options(args[2], RUN_OPTS, "Opts", "option")
    outputs = _named_map(opts.get("outputs", {}), "outputs", _size)
    total_in, total_out = sum(map(len, buffers.values())), sum(outputs.values())
    if total_in > config.max_input_bytes:
        raise too_large(f"buffers of {total_in} bytes are over KEM_MAX_INPUT_BYTES={config.max_input_bytes}")
    if total_out > config.max_output_bytes:  # with in/out buffers, checked again once bound (gpu/named/named_run.py)
        raise too_large(f"outputs of {total_out} bytes are over KEM_MAX_OUTPUT_BYTES={config.max_output_bytes}")
    groups = _workgroups(opts["workgroups"]) if "workgroups" in opts else None
    grid = _grid(opts["grid"]) if "grid" in opts else None
    if groups is not None and grid is not None:
        raise bad_args("give grid (invocations) or workgroups, not both")
    entry = _entry_point(opts["entry_point"]) if "entry_point" in opts else "main"
    overrides = constants(opts["constants"]) if "constants" in opts else None
    gas = _positive_int(opts["gas_limit"], "gas_limit", MAX_GAS) if "gas_limit" in opts else None
    usage = opts.get("usage", False)
    if usage is not True and usage is not False:
        raise bad_args("usage must be true or false")
    call = NamedCall(kernel_id, buffers, outputs, groups, entry, grid, overrides, gas)
    return RunRequest(req_id, call, deadline, timeout_s, usage)


def _named_map(value: Any, what: str, read) -> dict:
    if not isinstance(value, dict):
        raise bad_args(f"{what} must be a map of buffer names to values")
    if len(value) > MAX_BUFFERS:
        raise too_large(f"{len(value)} {what}; at most {MAX_BUFFERS}")
    found: dict = {}
    for key, item in value.items():
        name = _key(key)
        if name in found:
            raise bad_args(f"{what}: {name!r} given twice")
        found[name] = read(item, name)
    return found


def _key(key: Any) -> str:
    """A buffer's name as the binding model takes it: a WGSL name, "G/B", or "B"."""
    if type(key) is int and 0 <= key <= 9999:
        return str(key)
    name = atom_name(key)
    if name is None:
        raw = binary_bytes(key)
        name = raw.decode("ascii", "replace") if raw is not None else None
    if name is None or not _KEY.fullmatch(name):
        raise bad_args(f"{shown(key)} is not a buffer name: a WGSL identifier, <<\"G/B\">> or a binding number")
    return name


def _size(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise bad_args(f"output {name!r}: its size must be an integer >= 0 (bytes)")
    return value
