#!/usr/bin/env python3
"""A/B comparison of port settings, measured side by side in one run.

Each variant is a port started with its own KEM_* settings; small calls
alternate between them call by call, and throughput rounds alternate
A, B, A, B..., so drift of the machine (clocks, other load) falls on all
variants alike. Prints p50/p99 of the small call and calls/s at 1, 8 and
64 in flight for each. Usage:

    python scripts/ab_ports.py NAME:KEY=VALUE[,KEY=VALUE] NAME:... [out.json]
    e.g. python scripts/ab_ports.py block:KEM_POLL_SPIN_US=0 spin:KEM_POLL_SPIN_US=2000
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from bench_port import SMALL, pct, rate
from kem_port.client import PortClient

ROUNDS = 3


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, settings = text.partition(":")
    env = dict(item.split("=", 1) for item in settings.split(",") if item)
    return name, env


def main(argv: list[str]) -> int:
    specs = [a for a in argv[1:] if ":" in a]
    out_file = next((a for a in argv[1:] if a.endswith(".json")), None)
    variants = [parse_variant(s) for s in specs]
    ports = {name: PortClient(env) for name, env in variants}
    try:
        for port in ports.values():
            assert port.call("execute_kernel", b"double", SMALL, 1) == bytes([2, 6, 10, 14])
        lat: dict[str, list[float]] = {name: [] for name in ports}
        for i in range(4000):
            for name, port in ports.items():
                t = time.perf_counter()
                port.call("execute_kernel", b"double", SMALL, 1)
                if i >= 100:
                    lat[name].append((time.perf_counter() - t) * 1e6)
        rates: dict[str, dict[int, list[float]]] = {name: {1: [], 8: [], 64: []} for name in ports}
        for _ in range(ROUNDS):
            for in_flight in (1, 8, 64):
                for name, port in ports.items():
                    rates[name][in_flight].append(rate(port, in_flight, 1.0))
    finally:
        for port in ports.values():
            port.close()
    result = {}
    for name, env in variants:
        small = sorted(lat[name])
        result[name] = {
            "env": env,
            "small_p50_us": pct(small, 50),
            "small_p99_us": pct(small, 99),
            "calls_per_s": {str(k): statistics.median(v) for k, v in rates[name].items()},
        }
        r = result[name]
        print(f"{name:>10}: small p50 {r['small_p50_us']:6.0f} us  p99 {r['small_p99_us']:6.0f} us  | "
              + "  ".join(f"{k} in flight {v:7.0f}/s" for k, v in r["calls_per_s"].items()))
    if out_file:
        with open(out_file, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
