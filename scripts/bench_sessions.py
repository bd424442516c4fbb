#!/usr/bin/env python3
"""Sessions and chains against their same-run baselines (docs/sessions.md).

Rows, each the median (and p90) of its samples, taken in interleaved rounds:

* small call: ``double`` on 4 bytes, the baseline of everything below;
* resident step: one ``accumulate`` step on a resident state (4 KB: the
  session call's own cost; STATE_MB: with the kernel's work), driven by a
  4-byte session call that returns nothing;
* round trip: what that step replaces without sessions, the same kernel
  work with the state uploaded and read back (``double`` on STATE_MB);
* chain of 10: ten ``double`` steps on 4 bytes in one submission;
* 10 calls: the same ten steps as ten calls, one after the other.

Driven from Python over the port's pipes, so it runs on the lent GPU
machine too (no Erlang there); kem_session adds one gen_server hop.
Usage: python scripts/bench_sessions.py [state_mb] [reps]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kem_port.client import PortClient

KERNELS = Path(__file__).resolve().parents[1] / "tests" / "session_kernels"
SMALL = bytes([1, 3, 5, 7])


def interleaved(rows: list[tuple[str, Callable[[], object], int]], rounds: int) -> dict[str, dict[str, float]]:
    """Time rows in rounds, one sample of each a round (a row with every=K
    only every K-th round), so a shared machine's load drifts over all of
    them alike; median and p90 in ms, after one untimed round."""
    for _, fn, _ in rows:
        fn()
    samples: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for r in range(rounds):
        for name, fn, every in rows:
            if r % every == 0:
                started = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - started) * 1e3)
    return {name: {"median_ms": statistics.median(v), "p90_ms": sorted(v)[max(0, len(v) * 9 // 10 - 1)]} for name, v in samples.items()}


def main() -> None:
    state_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    state_bytes = state_mb << 20
    with PortClient({"KEM_KERNEL_DIR": str(KERNELS)}) as port:
        info = json.loads(port.call("adapter_info"))
        session = port.session_open()
        session.create("acc", state_bytes)
        small_state = port.session_open()
        small_state.create("acc", 4096)
        big = np.random.default_rng().integers(0, 256, state_bytes, dtype=np.uint8).tobytes()
        one_word = (1).to_bytes(4, "little")
        ten = [{"kernel": "double"}] * 10
        small_call = lambda: port.call("execute_kernel", b"double", SMALL, 1)  # noqa: E731
        # Small rows and large rows are interleaved apart: right after a
        # 64 MB step, lavapipe's small calls ran several times slower.
        rows = interleaved([
            ("small call", small_call, 1),
            ("resident step (4 KB state, 4-byte call)", lambda: small_state.call("accumulate", one_word, output_size=0), 1),
            ("chain of 10 small steps", lambda: port.chain(ten, input=SMALL), 1),
            ("10 small calls in turn", lambda: [small_call() for _ in range(10)], 1),
        ], 4 * reps)
        rows.update(interleaved([
            (f"resident step ({state_mb} MB state, 4-byte call)", lambda: session.call("accumulate", one_word, output_size=0), 1),
            (f"round trip ({state_mb} MB up and back)", lambda: port.call("execute_kernel", b"double", big, 1), 10),
        ], reps))
        # The state really moved: every step added 1 to every word.
        steps = reps + 1
        head = np.frombuffer(session.read("acc", 0, 16), "<u4")
        assert (head == steps).all(), f"state {head} after {steps} steps"
        session.close()
    small = rows["small call"]["median_ms"]
    print(f"adapter: {info.get('name')} ({info.get('backend')}, {info.get('adapter_type')})")
    print(f"{'row':48} {'median ms':>10} {'p90 ms':>9} {'x small call':>13}")
    for name, row in rows.items():
        print(f"{name:48} {row['median_ms']:10.3f} {row['p90_ms']:9.3f} {row['median_ms'] / small:13.2f}")


if __name__ == "__main__":
    main()
