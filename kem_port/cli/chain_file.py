"""A chain file for ``kem chain``: JSON, read into the terms the port takes.

    {"buffers": {"src": "@data.bin", "dst": "zeros:4K", "x": "random:1K"},
     "input": "@in.bin",
     "steps": [{"kernel": "bitonic_pass", "buffers": {"pass_": [2, 1]}, "grid": [1024, 1, 1]},
               {"copy": ["dst", 0, "src", 0, 4096]},
               {"clear": ["dst", 0, 4096]}],
     "return": ["src"]}

Bytes are ``"@FILE"`` (relative to the chain file), ``"hex:HEX"``,
``"random:BYTES"`` (seeded by ``--seed``), ``"zeros:BYTES"`` (a session
buffer only), or a list of u32 words (as dev_kem's ``params``). A step's
keys are the Erlang API's (docs/sessions.md); a ``kernel`` may be a
``.wgsl`` path (relative to the chain file). Nothing here checks what the
port checks: its errors come back in its words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kem_port.cli import inputs
from kem_port.cli.console import CliError

TRIPLES = ("workgroups", "grid")
BYTES = ("params",)
TOP = ("buffers", "input", "steps", "return")


@dataclass
class ChainFile:
    buffers: dict[str, bytes | int] = field(default_factory=dict)  # session buffers: bytes, or a size of zeros
    input: bytes = b""
    steps: list[dict] = field(default_factory=list)
    returns: list[str] | None = None
    kernel_files: dict[str, Path] = field(default_factory=dict)  # kernel id -> .wgsl path


def read(path: str, rng: np.random.Generator, limit: int) -> ChainFile:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(body, dict) or set(body) - set(TOP) or not isinstance(body.get("steps"), list):
        raise CliError(f"{path}: a chain file is an object with steps (a list) and optionally {', '.join(t for t in TOP if t != 'steps')}")
    reader = _Reader(Path(path).resolve().parent, rng, limit)
    chain = ChainFile()
    chain.buffers = {name: reader.contents(value, f"buffer {name}") for name, value in _obj(body.get("buffers", {}), "buffers").items()}
    if "input" in body:
        chain.input = reader.bytes(body["input"], "input")
    chain.steps = [reader.step(i + 1, step, chain.kernel_files) for i, step in enumerate(body["steps"])]
    if "return" in body:
        if not isinstance(body["return"], list) or not all(isinstance(n, str) for n in body["return"]):
            raise CliError(f"{path}: return is a list of buffer names")
        chain.returns = body["return"]
    return chain


def _obj(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise CliError(f"{what} must be an object")
    return value


class _Reader:
    def __init__(self, base: Path, rng: np.random.Generator, limit: int) -> None:
        self.base, self.rng, self.limit = base, rng, limit

    def step(self, n: int, step: Any, kernel_files: dict[str, Path]) -> dict:
        """A step as the port reads it: lists to tuples, byte specs to bytes."""
        where = f"step {n}"
        out: dict[str, Any] = {}
        for key, value in _obj(step, where).items():
            if key in ("copy", "clear") or key in TRIPLES:
                out[key] = tuple(value) if isinstance(value, list) else value
            elif key in BYTES:
                out[key] = self.bytes(value, f"{where} {key}")
            elif key == "buffers":
                out[key] = {name: self.bytes(v, f"{where} buffer {name}") for name, v in _obj(value, f"{where} buffers").items()}
            elif key == "kernel" and isinstance(value, str) and value.endswith(".wgsl"):
                file = (self.base / value).resolve()
                out[key] = file.stem
                if kernel_files.setdefault(file.stem, file) != file:
                    raise CliError(f"{where}: two kernel files named {file.stem}.wgsl")
            else:
                out[key] = value
        return out

    def contents(self, value: Any, what: str) -> bytes | int:
        if isinstance(value, str) and value.startswith("zeros:"):
            return self._size(value[6:], what)
        return self.bytes(value, what)

    def bytes(self, value: Any, what: str) -> bytes:
        if isinstance(value, list):
            if not all(type(w) is int and 0 <= w < 2**32 for w in value):
                raise CliError(f"{what}: a list of u32 words (0..4294967295)")
            return np.array(value, dtype="<u4").tobytes()
        if not isinstance(value, str):
            raise CliError(f"{what}: bytes are \"@FILE\", \"hex:HEX\", \"random:BYTES\" or a list of u32 words")
        if value.startswith("@"):
            path = self.base / value[1:]
            try:
                inputs.within(path.stat().st_size, self.limit, value[1:])
                return path.read_bytes()
            except OSError as exc:
                raise CliError(f"{what}: cannot read {value[1:]}: {exc.strerror}") from None
        if value.startswith("hex:"):
            try:
                return inputs.hex_bytes(value[4:])
            except Exception:
                raise CliError(f"{what}: not hex: {value[4:40]!r}") from None
        if value.startswith("random:"):
            return self.rng.bytes(self._size(value[7:], what))
        raise CliError(f"{what}: bytes are \"@FILE\", \"hex:HEX\", \"random:BYTES\" or a list of u32 words, not {value[:40]!r}")

    def _size(self, text: str, what: str) -> int:
        try:
            count = inputs.size(text)
        except Exception:
            raise CliError(f"{what}: not a size: {text!r} (e.g. 4096, 64K)") from None
        inputs.within(count, self.limit, what)
        return count
