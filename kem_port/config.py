"""Settings: ONE table of every setting, read once from ``KEM_*`` variables.

Each :class:`Setting` has a name, its parser, default and a one-line doc.
The rule the Erlang app follows: app env key ``foo_bar`` is passed to the
port as ``KEM_FOO_BAR``, for every setting here. The README's settings
table is rendered from this list (:func:`settings_table`) and a test
checks it. An invalid value stops the port at start-up with a message
naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class Setting:
    name: str  # the app env key; the variable is KEM_<NAME>
    field: str  # the Config attribute it sets
    default: Any
    parse: Callable[[str], Any]  # raises ValueError with the reason
    shown: str  # the default, as the README shows it
    doc: str

    @property
    def env(self) -> str:
        return "KEM_" + self.name.upper()


def _integer(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("is not an integer") from None
        if value < minimum:
            raise ValueError(f"is below {minimum}")
        return value

    return parse


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise ValueError(f"is not one of {', '.join(allowed)}")
        return value

    return parse


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _log_level(raw: str) -> str:
    value = raw.strip().lower()
    if value not in LOG_LEVELS:
        raise ValueError(f"is not a log level ({', '.join(LOG_LEVELS)})")
    return value.upper()


def _list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def _text(raw: str) -> str:
    return raw


def _ms_to_s(raw: str) -> float:
    return _integer(1)(raw) / 1000.0


GATEWAYS = ["https://arweave.net"]
S = Setting
SETTINGS: tuple[Setting, ...] = (
    S("log", "log_level", "WARNING", _log_level, "`warning`", "`debug`, `info`, `warning`, `error` or `critical`: records at this level and up go to the node's `logger` as frames (docs/logging.md)"),
    S("adapter", "adapter", None, _text, "best available", "adapter by index or name substring"),
    S("max_output_bytes", "max_output_bytes", 256 * MiB, _integer(4), "256 MiB", "largest output; refused beyond, before allocating (the adapter's binding limit also applies)"),
    S("max_input_bytes", "max_input_bytes", 256 * MiB, _integer(4), "256 MiB", "largest input; refused beyond, before allocating"),
    S("gas_turns", "gas_turns", 60_000, _integer(1), "60000", "the most loop turns one invocation may count in one call, whatever its gas limit (at most 65,000 on a CPU adapter: lavapipe ends loops at 65,535 by itself; docs/metering.md)"),
    S("gas_limit", "gas_limit", 1 << 34, _integer(1), "2^34", "a call's gas budget when it gives no `gas_limit` option: invocations launched plus loop iterations (docs/metering.md); past it, `gas_exhausted`"),
    S("max_params_bytes", "max_params_bytes", 64 * 1024, _integer(16), "64 KiB", "largest params binary"),
    S("kernel_dir", "kernel_dir", None, Path, "–", "`<id>.wgsl` files, searched before the packaged examples"),
    S("queue_limit", "queue_limit", 1024, _integer(1), "1024", "kernel calls held per port (queued, in flight, or waiting on a fetch or the compile worker); beyond, `overloaded` at once"),
    S("queue_bytes", "queue_bytes", 1024 * MiB, _integer(1), "1 GiB", "bytes of those calls (the larger of input and output each); beyond, `overloaded` at once"),
    S("max_batch", "max_batch", 64, _integer(1), "64", "most calls in one GPU submission; the batch size adapts below it"),
    S("pool_bytes", "pool_bytes", 1024 * MiB, _integer(0), "1 GiB", "idle GPU buffers kept for reuse"),
    S("gateways", "gateways", GATEWAYS, lambda raw: _list(raw) or list(GATEWAYS), "`https://arweave.net`", "comma-separated gateway base URLs, tried in order"),
    S("verify", "verify", "strict", _choice("strict", "pinned", "strict+pinned", "off"), "`strict`", "`strict`, `pinned`, `strict+pinned`, `off` (above)"),
    S("allowed_owners", "allowed_owners", [], _list, "–", "comma-separated signer addresses allowed under `strict` (above)"),
    S("pins", "pins_file", None, Path, "–", "file of lines `<id> <sha256-hex>` for `pinned` (above)"),
    S("cache_dir", "cache_dir", None, Path, "`~/.cache/kem/kernels`", "verified kernels fetched from gateways"),
    S("max_kernel_bytes", "max_kernel_bytes", 1 * MiB, _integer(1), "1 MiB", "largest kernel fetched, checked before download"),
    S("fetch_timeout_ms", "fetch_timeout_s", 10.0, _ms_to_s, "10000", "per gateway request"),
    S("fetch_retries", "fetch_retries", 2, _integer(0), "2", "per gateway request"),
    S("fetch_deadline_ms", "fetch_deadline_s", 30.0, _ms_to_s, "30000", "one fetch, every gateway and retry included; each gateway gets at most its requests' timeouts"),
    S("gateway_concurrency", "gateway_concurrency", 4, _integer(1), "4", "fetches at once per gateway; a fetch finding none free tries the next gateway"),
    S("compile_timeout_ms", "compile_timeout_s", 20.0, _ms_to_s, "20000", "CPU-time budget of a new kernel's compile in the sacrificial worker (wall-time backstop 3x; docs/security.md)"),
    S("compile_memory_mb", "compile_memory_mb", 1024, _integer(64), "1024", "memory the compile worker may add to its open device (`RLIMIT_DATA`)"),
    S("zero_workgroup", "zero_workgroup", "on", _choice("on", "auto", "off"), "`on`", "clear workgroup memory at each entry point (`auto`: only where the worker's probe sees a leak)"),
    S("test_hooks", "test_hooks", False, lambda raw: raw == "1", "off", "`1` enables the `test_hook` method (tests only)"),
    S("gpu_timing", "gpu_timing", "auto", _choice("auto", "on", "off"), "`auto`", "GPU timestamps (`auto`: one batch in 16 on real GPUs, none on CPU adapters; `on`: every batch)"),
    S("hot_path", "hot_path", "auto", _choice("auto", "native", "wrappers"), "`auto`", "a batch's native calls: `native` (wgpu-native's C API), `wrappers` (wgpu-py's objects), `auto` (native when this wgpu-py has what it needs; docs/executor.md)"),
    S("poll_spin_us", "poll_spin_us", None, _integer(0), "by adapter", "µs of non-blocking polls before a blocking wait (2000 on GPUs, 0 on CPU adapters; docs/executor.md)"),
    S("read_spin_us", "read_spin_us", 0, _integer(0), "0 (off)", "µs the reader polls its pipe after each frame before it blocks in `read`: a lone caller's next call then finds it awake; off by default, it cost 64 callers 20-35% on an H100 (docs/executor.md)"),
    S("slot_dispatch", "slot_dispatch", "on", _choice("on", "off"), "`on`", "a group of calls to a plain kernel as one dispatch through its rewritten slot form (`off`: one dispatch per call; docs/dispatch.md)"),
    S("cross_caller_dispatch", "cross_caller_dispatch", "on", _choice("on", "off"), "`on`", "calls of different callers may share a dispatch: a plain kernel's group through its slot form, a listed call-table kernel's calls in one table (`off`: one dispatch per call, whatever `slot_dispatch` and `shared_table_kernels` say; docs/dispatch.md)"),
    S("shared_table_kernels", "shared_table_kernels", [], _list, "none", "comma-separated ids of call-table kernels whose calls may share a dispatch across callers (each call sees every row of it); any other call-table kernel gets a dispatch per call (docs/dispatch.md)"),
    S("session_quota_bytes", "session_quota_bytes", 1024 * MiB, _integer(4), "1 GiB", "GPU bytes one session's buffers (or one chain's temporaries) may hold; a session may ask for less (docs/sessions.md)"),
    S("port_session_quota_bytes", "port_session_quota_bytes", 4096 * MiB, _integer(4), "4 GiB", "GPU bytes all sessions of one port may hold together"),
    S("shm_dir", "shm_dir", None, lambda raw: Path(raw).resolve(), "set by the app", "the node's `/dev/shm` directory for large payloads (app env `shm_threshold`, 1 MiB)"),
)
del S
_DEFAULTS = {s.field: s.default for s in SETTINGS}


def _default(name: str) -> Any:
    value = _DEFAULTS[name]
    return field(default_factory=lambda: list(value)) if isinstance(value, list) else value


def _default_cache_dir(env: dict[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kem" / "kernels"


@dataclass(frozen=True)
class Config:
    log_level: str = _default("log_level")
    adapter: str | None = _default("adapter")
    max_output_bytes: int = _default("max_output_bytes")
    max_input_bytes: int = _default("max_input_bytes")
    max_params_bytes: int = _default("max_params_bytes")
    gas_limit: int = _default("gas_limit")
    gas_turns: int = _default("gas_turns")
    kernel_dir: Path | None = _default("kernel_dir")
    queue_limit: int = _default("queue_limit")
    queue_bytes: int = _default("queue_bytes")
    max_batch: int = _default("max_batch")
    pool_bytes: int = _default("pool_bytes")
    gateways: list[str] = _default("gateways")
    verify: str = _default("verify")
    allowed_owners: list[str] = _default("allowed_owners")
    pins_file: Path | None = _default("pins_file")
    cache_dir: Path | None = _default("cache_dir")
    max_kernel_bytes: int = _default("max_kernel_bytes")
    fetch_timeout_s: float = _default("fetch_timeout_s")
    fetch_retries: int = _default("fetch_retries")
    fetch_deadline_s: float = _default("fetch_deadline_s")
    gateway_concurrency: int = _default("gateway_concurrency")
    compile_timeout_s: float = _default("compile_timeout_s")
    compile_memory_mb: int = _default("compile_memory_mb")
    zero_workgroup: str = _default("zero_workgroup")
    test_hooks: bool = _default("test_hooks")
    gpu_timing: str = _default("gpu_timing")
    hot_path: str = _default("hot_path")
    poll_spin_us: int | None = _default("poll_spin_us")  # None: chosen by adapter type
    read_spin_us: int = _default("read_spin_us")
    slot_dispatch: str = _default("slot_dispatch")
    cross_caller_dispatch: str = _default("cross_caller_dispatch")
    shared_table_kernels: list[str] = _default("shared_table_kernels")
    session_quota_bytes: int = _default("session_quota_bytes")
    port_session_quota_bytes: int = _default("port_session_quota_bytes")
    shm_dir: Path | None = _default("shm_dir")

    @property
    def max_frame_bytes(self) -> int:
        # Input, params and the kernel id plus room for the term's own bytes.
        return self.max_input_bytes + self.max_params_bytes + 64 * 1024

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Config":
        """Every setting from its variable; unset or blank means the default.
        Raises SystemExit naming the variable when a value is invalid."""
        env = dict(os.environ if env is None else env)
        values = {s.field: _read(s, env) for s in SETTINGS}
        if values["cache_dir"] is None:
            values["cache_dir"] = _default_cache_dir(env)
        return cls(**values)


def _read(setting: Setting, env: dict[str, str]) -> Any:
    raw = env.get(setting.env)
    if raw is None or raw.strip() == "":
        default = setting.default
        return list(default) if isinstance(default, list) else default
    try:
        return setting.parse(raw.strip())
    except ValueError as exc:
        raise SystemExit(f"kem_port: {setting.env}={raw!r} {exc}") from None


def settings_table() -> str:
    """The README's settings table, one row per setting."""
    rows = ["| variable (app env key) | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.env}` (`{s.name}`) | {s.shown} | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)
