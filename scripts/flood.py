#!/usr/bin/env python3
"""Back-pressure: flood one port with 10x its queue capacity while its GPU
thread is busy; print how many calls were refused at once and the port's
memory before, during and after. Usage: scripts/flood.py [QueueLimit] [InputKiB]"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from kem_port.wire import terms  # noqa: E402
from kem_port.client import PortClient  # noqa: E402
from fuzz import max_rss_kib  # noqa: E402


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def main(argv: list[str]) -> int:
    limit = int(argv[1]) if len(argv) > 1 else 64
    size = (int(argv[2]) if len(argv) > 2 else 256) * 1024
    with PortClient({"KEM_QUEUE_LIMIT": str(limit), "KEM_TEST_HOOKS": "1"}) as port:
        port.call("execute_kernel", b"double", bytes(size), 1)
        before = rss_kib(port.proc.pid)
        port.call_async("test_hook", terms.atom("sleep_gpu"), 3000)
        time.sleep(0.2)
        started = time.monotonic()
        flood = [port.call_async("execute_kernel", b"double", bytes(size), 1) for _ in range(10 * limit)]
        sent = time.monotonic()
        during = rss_kib(port.proc.pid)
        wait(flood, timeout=120)
        refused = sum(1 for f in flood if f.exception() is not None and f.exception().reason == "overloaded")
        served = sum(1 for f in flood if f.exception() is None)
        result = {
            "queue_limit": limit, "input_bytes": size, "flood_calls": len(flood), "overloaded": refused,
            "served": served, "send_seconds": round(sent - started, 3),
            "rss_kib_before": before, "rss_kib_during": during, "rss_kib_after": rss_kib(port.proc.pid),
            "max_rss_kib": max_rss_kib(port.proc.pid),
        }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
