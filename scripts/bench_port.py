#!/usr/bin/env python3
"""The benchmark driven from Python over the port's pipes, for machines with
no Erlang (the lent GPU). Same frames as Erlang's kem_port sends, same
measurements and JSON keys as scripts/bench (kem_bench.erl), plus GPU kernel
time from timestamp queries where the adapter has them.

Usage: python scripts/bench_port.py [quick|full] [out.json]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import wait
from pathlib import Path

from kem_port.wire import terms
from kem_port.client import PortClient

TOOLS = Path(__file__).resolve().parents[1] / "tools"
SMALL = bytes([1, 3, 5, 7])
PARAMS = {
    "quick": dict(small_calls=2000, seconds=2, bulk_mb=[1, 16, 64], bulk_reps=3, seed_calls=20, ports=[1]),
    "full": dict(small_calls=5000, seconds=3, bulk_mb=[1, 16, 64, 256], bulk_reps=5, seed_calls=20, ports=[1, 2, 4]),
}


def latencies(port: PortClient, n: int) -> list[float]:
    for _ in range(50):
        port.call("execute_kernel", b"double", SMALL, 1)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        port.call("execute_kernel", b"double", SMALL, 1)
        out.append((time.perf_counter() - t) * 1e6)
    return sorted(out)


def pct(sorted_values: list[float], p: float) -> float:
    return sorted_values[max(0, min(len(sorted_values) - 1, round(len(sorted_values) * p / 100) - 1))]


def rate(port: PortClient | list[PortClient], in_flight: int, seconds: float,
         kernel: bytes = b"double", payload: bytes = SMALL) -> float:
    """Keep `in_flight` calls outstanding (one per simulated caller). With a
    list of ports, calls go round robin over them, as kem_sup spreads an
    Erlang node's callers over its `ports`."""
    ports = port if isinstance(port, list) else [port]
    turn = iter(range(1 << 62))

    def send():
        return ports[next(turn) % len(ports)].call_async("execute_kernel", kernel, payload, 1)

    deadline = time.perf_counter() + seconds
    done = 0
    started = time.perf_counter()
    pending = {send() for _ in range(in_flight)}
    while pending:
        finished, pending = wait(pending, return_when="FIRST_COMPLETED")
        for fut in finished:
            fut.result()
            done += 1
            if time.perf_counter() < deadline:
                pending.add(send())
    return done / (time.perf_counter() - started)


def spread_rates(counts: list[int], seconds: float) -> dict[int, float]:
    """64 in flight over N port processes (each its own device and GIL)."""
    out = {}
    for n in counts:
        ports = [PortClient() for _ in range(n)]
        try:
            for p in ports:
                p.call("execute_kernel", b"double", SMALL, 1)
            out[n] = rate(ports, 64, seconds)
        finally:
            for p in ports:
                p.close()
    return out


SHM_DIR = f"/dev/shm/kem-bench-{os.getpid()}"


def via_shm(port: PortClient, data: bytes) -> bytes:
    """What Erlang's kem_shm does: input and result as /dev/shm files."""
    base = f"{SHM_DIR}/{time.perf_counter_ns()}"
    try:
        with open(base + ".in", "wb") as fh:
            fh.write(data)
        _, _, size = port.call("execute", b"double", (terms.atom("shm"), (base + ".in").encode()),
                               {"output_shm": (base + ".out").encode()})
        with open(base + ".out", "rb") as fh:
            out = fh.read()
        assert len(out) == size
        return out
    finally:
        for suffix in (".in", ".out"):
            try:
                os.unlink(base + suffix)
            except FileNotFoundError:
                pass


def bulk(port: PortClient, mb: int, reps: int, shm: bool = False) -> float:
    data = os.urandom(mb << 20)
    call = (lambda: via_shm(port, data)) if shm else (lambda: port.call("execute_kernel", b"double", data, 1))
    assert len(call()) == len(data)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return (mb << 20) / statistics.median(times) / 1e9


def seed_design(calls: int) -> dict:
    out = subprocess.run([sys.executable, str(TOOLS / "seed_design.py"), str(calls)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def coalesced(port: PortClient, seconds: float) -> dict:
    """64 callers of the call-table kernel (double_table, one dispatch for a
    batch's calls) against the same calls to double (a dispatch each), for
    4 B and 1 KiB inputs: calls/s, items/s (output words) and calls per dispatch."""
    out = {}
    for label, payload in (("4 B", SMALL), ("1 KiB", bytes(range(256)) * 4)):
        assert port.call("execute_kernel", b"double_table", payload, 1) == port.call("execute_kernel", b"double", payload, 1)
        plain = rate(port, 64, seconds, b"double", payload)
        before = port.call("stats")
        tabled = rate(port, 64, seconds, b"double_table", payload)
        after = port.call("stats")
        calls = stat(after, "table_calls") - stat(before, "table_calls")
        dispatches = stat(after, "table_dispatches") - stat(before, "table_dispatches")
        out[label] = {
            "double_calls_per_s": plain, "table_calls_per_s": tabled,
            "table_items_per_s": tabled * len(payload) / 4, "calls_per_dispatch": calls / max(dispatches, 1),
        }
    return out


def stat(stats: dict, name: str) -> int:
    return stats.get(terms.atom(name), 0)


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "quick"
    out_file = argv[2] if len(argv) > 2 else "bench.json"
    p = PARAMS[mode]
    os.makedirs(SHM_DIR, exist_ok=True)
    with PortClient({"KEM_SHM_DIR": SHM_DIR}) as port, PortClient(script=str(TOOLS / "echo_port.py")) as echo:
        info = json.loads(port.call("adapter_info"))
        limit = info["limits"]["max_storage_buffer_binding_size"]
        assert port.call("execute_kernel", b"double", SMALL, 1) == bytes([2, 6, 10, 14])
        small, echo_small = latencies(port, p["small_calls"]), latencies(echo, p["small_calls"])
        before = port.call("stats")
        gpu_probe = latencies(port, 500)
        after = port.call("stats")
        samples = stat(after, "gpu_kernel_samples") - stat(before, "gpu_kernel_samples")
        gpu_us = (stat(after, "gpu_kernel_us") - stat(before, "gpu_kernel_us")) / samples if samples else None
        rates = {c: rate(port, c, p["seconds"]) for c in (1, 8, 64)}
        echo_rates = {c: rate(echo, c, p["seconds"]) for c in (1, 8, 64)}
        table = coalesced(port, p["seconds"])
        sizes = [mb for mb in p["bulk_mb"] if mb << 20 <= limit]
        bulk_rates = {mb: bulk(port, mb, p["bulk_reps"], shm=mb >= 1) for mb in sizes}
        bulk_pipe = {mb: bulk(port, mb, p["bulk_reps"]) for mb in sizes}
        echo_bulk = {mb: bulk(echo, mb, p["bulk_reps"]) for mb in sizes}
        stats = port.call("stats")
    os.rmdir(SHM_DIR)
    by_ports = spread_rates(p["ports"], p["seconds"])
    seed = seed_design(p["seed_calls"])
    result = {
        "mode": mode, "driver": "python", "adapter": info["name"], "adapter_type": info["adapter_type"],
        "small_p50_us": pct(small, 50), "small_p99_us": pct(small, 99),
        "echo_small_p50_us": pct(echo_small, 50), "echo_small_p99_us": pct(echo_small, 99),
        "small_gpu_kernel_us": gpu_us, "small_wall_p50_us_during_gpu_probe": pct(gpu_probe, 50),
        "calls_per_s": {str(k): v for k, v in rates.items()},
        "echo_calls_per_s": {str(k): v for k, v in echo_rates.items()},
        "coalesced": table,
        "calls_per_s_64_by_ports": {str(k): v for k, v in by_ports.items()},
        "seed_design_calls_per_s": seed["calls_per_s"], "seed_design_median_ms": seed["median_ms"],
        "bulk_gbps": {str(k): v for k, v in bulk_rates.items()},
        "bulk_pipe_gbps": {str(k): v for k, v in bulk_pipe.items()},
        "echo_bulk_gbps": {str(k): v for k, v in echo_bulk.items()},
        "ratios": {
            "small_p50_over_echo": pct(small, 50) / pct(echo_small, 50),
            "calls_64_over_seed": rates[64] / seed["calls_per_s"],
            "calls_64_best_ports_over_seed": max(by_ports.values()) / seed["calls_per_s"],
            "bulk_64mb_over_echo": bulk_rates.get(64, 0) / echo_bulk[64] if 64 in echo_bulk else None,
        },
        "port_stats": {terms.atom_name(k): v for k, v in stats.items() if isinstance(v, (int, float))},
    }
    with open(out_file, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nkem bench ({mode}, python driver) on {info['name']} ({info['adapter_type']}, {info['backend']})")
    print(f"  small call p50 {result['small_p50_us']:.0f} us  p99 {result['small_p99_us']:.0f} us"
          f"   | echo p50 {result['echo_small_p50_us']:.0f} us  p99 {result['echo_small_p99_us']:.0f} us")
    if gpu_us is not None:
        print(f"  GPU time of the small kernel (timestamp queries): {gpu_us:.1f} us of {pct(gpu_probe, 50):.0f} us wall")
    for c in (1, 8, 64):
        print(f"  {c:2d} in flight: {rates[c]:9.0f} calls/s   | echo {echo_rates[c]:9.0f} calls/s")
    for label, row in table.items():
        print(f"  64 in flight, {label}: {row['double_calls_per_s']:9.0f} calls/s with double, "
              f"{row['table_calls_per_s']:9.0f} with double_table ({row['table_items_per_s']:.3g} items/s, "
              f"{row['calls_per_dispatch']:.1f} calls a dispatch)")
    for n, r in by_ports.items():
        print(f"  64 in flight over {n} port{'s' if n > 1 else ''}: {r:9.0f} calls/s")
    print(f"  original per-call design: {seed['calls_per_s']:.1f} calls/s (median {seed['median_ms']:.1f} ms)")
    for mb in sizes:
        print(f"  bulk {mb:3d} MB: {bulk_rates[mb]:6.3f} GB/s (pipe alone {bulk_pipe[mb]:6.3f})   | echo {echo_bulk[mb]:6.3f} GB/s")
    r = result["ratios"]
    print(f"  ratios: small/echo {r['small_p50_over_echo']:.2f}; 64 in flight/original {r['calls_64_over_seed']:.0f}x "
          f"({r['calls_64_best_ports_over_seed']:.0f}x over the best port count); "
          f"bulk 64 MB/echo {r['bulk_64mb_over_echo']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
