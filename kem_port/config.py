"""Settings, read once from ``KEM_*`` environment variables.

The Erlang application passes its app env to the port as these variables, so
this is the one place a setting is parsed and defaulted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1 << 20


def _env_int(env: dict[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"kem_port: {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SystemExit(f"kem_port: {name}={value} is below {minimum}")
    return value


def _env_list(env: dict[str, str], name: str) -> list[str]:
    return [item.strip() for item in env.get(name, "").split(",") if item.strip()]


def _choice(env: dict[str, str], name: str, allowed: tuple[str, ...]) -> str:
    value = env.get(name, allowed[0]).strip().lower() or allowed[0]
    if value not in allowed:
        raise SystemExit(f"kem_port: {name}={value!r}: use one of {', '.join(allowed)}")
    return value


def _default_cache_dir(env: dict[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kem" / "kernels"


@dataclass(frozen=True)
class Config:
    log_level: str = "WARNING"
    adapter: str | None = None
    max_output_bytes: int = 256 * MiB
    max_input_bytes: int = 256 * MiB
    max_params_bytes: int = 64 * 1024
    kernel_dir: Path | None = None
    queue_limit: int = 1024
    max_batch: int = 64
    pool_bytes: int = 1024 * MiB
    gateways: list[str] = field(default_factory=lambda: ["https://arweave.net"])
    verify: str = "strict"
    allowed_owners: list[str] = field(default_factory=list)
    pins_file: Path | None = None
    cache_dir: Path | None = None
    max_kernel_bytes: int = 1 * MiB
    fetch_timeout_s: float = 10.0
    fetch_retries: int = 2
    test_hooks: bool = False
    gpu_timing: str = "auto"
    shm_dir: Path | None = None
    poll_spin_us: int | None = None  # None: chosen by adapter type

    @property
    def max_frame_bytes(self) -> int:
        # Input, params and the kernel id plus room for the term's own bytes.
        return self.max_input_bytes + self.max_params_bytes + 64 * 1024

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Config":
        env = dict(os.environ if env is None else env)
        kernel_dir = env.get("KEM_KERNEL_DIR")
        pins = env.get("KEM_PINS")
        cache_dir = env.get("KEM_CACHE_DIR")
        verify = env.get("KEM_VERIFY", "strict").strip().lower()
        if verify not in ("strict", "pinned", "strict+pinned", "off"):
            raise SystemExit(f"kem_port: KEM_VERIFY={verify!r}: use strict, pinned, strict+pinned or off")
        return cls(
            log_level=env.get("KEM_LOG", "WARNING").upper(),
            adapter=env.get("KEM_ADAPTER") or None,
            max_output_bytes=_env_int(env, "KEM_MAX_OUTPUT_BYTES", 256 * MiB, 4),
            max_input_bytes=_env_int(env, "KEM_MAX_INPUT_BYTES", 256 * MiB, 4),
            max_params_bytes=_env_int(env, "KEM_MAX_PARAMS_BYTES", 64 * 1024, 16),
            kernel_dir=Path(kernel_dir) if kernel_dir else None,
            queue_limit=_env_int(env, "KEM_QUEUE_LIMIT", 1024, 1),
            max_batch=_env_int(env, "KEM_MAX_BATCH", 64, 1),
            pool_bytes=_env_int(env, "KEM_POOL_BYTES", 1024 * MiB, 0),
            gateways=_env_list(env, "KEM_GATEWAYS") or ["https://arweave.net"],
            verify=verify,
            allowed_owners=_env_list(env, "KEM_ALLOWED_OWNERS"),
            pins_file=Path(pins) if pins else None,
            cache_dir=Path(cache_dir) if cache_dir else _default_cache_dir(env),
            max_kernel_bytes=_env_int(env, "KEM_MAX_KERNEL_BYTES", 1 * MiB, 1),
            fetch_timeout_s=float(_env_int(env, "KEM_FETCH_TIMEOUT_MS", 10_000, 1)) / 1000.0,
            fetch_retries=_env_int(env, "KEM_FETCH_RETRIES", 2, 0),
            test_hooks=env.get("KEM_TEST_HOOKS") == "1",
            gpu_timing=_choice(env, "KEM_GPU_TIMING", ("auto", "on", "off")),
            shm_dir=Path(env["KEM_SHM_DIR"]).resolve() if env.get("KEM_SHM_DIR") else None,
            poll_spin_us=_env_int(env, "KEM_POLL_SPIN_US", -1, 0) if env.get("KEM_POLL_SPIN_US", "").strip() else None,
        )
