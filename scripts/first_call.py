#!/usr/bin/env python3
"""What a kernel's first call costs against later ones: a local kernel
(compile), and an Arweave kernel served by a loopback gateway (fetch +
verify + compile), then cached in memory and, in a new process, on disk.
Usage: .venv/bin/python scripts/first_call.py"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from arweave_fixture import Gateway, make_tx, new_key  # noqa: E402
from kem_port.wire import terms  # noqa: E402
from kem_port.client import PortClient  # noqa: E402

SMALL = bytes([1, 3, 5, 7])


def timed(port: PortClient, kernel: bytes) -> float:
    t = time.perf_counter()
    assert port.call("execute_kernel", kernel, SMALL, 1) == bytes([2, 6, 10, 14])
    return (time.perf_counter() - t) * 1e3


def later(port: PortClient, kernel: bytes) -> float:
    return statistics.median(timed(port, kernel) for _ in range(200))


def main() -> int:
    # A distinct source: compiles are keyed by content, so the packaged
    # double under another ID would reuse its pipeline.
    source = (ROOT / "kem_port" / "kernels" / "double.wgsl").read_bytes() + b"// published copy\n"
    gateway = Gateway()
    tx_id = gateway.publish_tx(make_tx(new_key(), source), source).encode()
    with tempfile.TemporaryDirectory() as cache:
        env = {"KEM_GATEWAYS": gateway.url, "KEM_CACHE_DIR": cache}
        with PortClient(env) as port:
            port.call("ping")
            first_local = timed(port, b"double")
            compile_ms = port.call("stats")[terms.atom("compile_us")] / 1e3
            local = later(port, b"double")
            first_remote = timed(port, tx_id)
            remote = later(port, tx_id)
        with PortClient(env) as port:
            timed(port, b"double")  # process warm-up, as in the first port
            disk_first = timed(port, tx_id)
    gateway.close()
    print(f"local kernel: first call {first_local:.1f} ms (compile {compile_ms:.1f} ms), later calls p50 {local:.3f} ms")
    print(f"Arweave kernel (loopback gateway, strict): first call {first_remote:.1f} ms "
          f"(fetch + RSA-PSS/deep-hash/data_root proof + compile), later calls p50 {remote:.3f} ms")
    print(f"new warmed process, verified disk cache: first call {disk_first:.1f} ms (no request; re-hash + compile)")
    print(f"gateway requests in all: {len(gateway.requests)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
