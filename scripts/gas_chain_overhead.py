"""Gas on chains (docs/metering.md, "Sessions and chains"): the same chain
with its kernels as written and as their gas forms (cap and meters bound,
meters read back), interleaved on one device, in-process; median ms.

    python scripts/gas_chain_overhead.py [life_side] [reps]
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from kem_port.config import Config
from kem_port.gpu.executor import Executor
from kem_port.gpu.session.chain_steps import Chain, Step
from kem_port.gpu.session.session_service import SessionService
from kem_port.kernel_store import source_from_bytes
from kem_port.stats import Stats

ROOT = Path(__file__).resolve().parent.parent
# out[i] = (0 + 1 + ... + in[i] - 1) % 16: in[i] iterations, and the next step's input stays small.
COUNTING = (Path(__file__).resolve().parents[1] / "tests" / "gas_kernels" / "counting.wgsl").read_bytes()  # one text for pytest and eunit


def main() -> None:
    side = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    executor = Executor(Config(), Stats())
    executor.open()
    service = SessionService(executor, Config(), Stats())
    rng = np.random.default_rng(1)
    life = source_from_bytes("life", (ROOT / "tests/session_kernels/life.wgsl").read_bytes(), "bench", "local")
    counting = source_from_bytes("counting", COUNTING, "bench", "local")
    sessions = service.sessions

    def session():
        made = sessions.get(sessions.incarnation, sessions.open(None))
        grid = rng.integers(0, 2, side * side, dtype=np.uint32).tobytes()
        sessions.create(made, "a", len(grid), grid)
        sessions.create(made, "b", len(grid), None)
        return made

    def life_chain(source, held):
        size = np.array([side, side], "<u4").tobytes()
        steps = tuple(Step(source, params=size, output_size=0, bind={"cur": "ab"[i % 2], "next": "ba"[i % 2]}) for i in range(20))
        return service.chains.run(Chain(steps, b"", ("a",), held))

    def counting_chain(source, n):
        data = rng.integers(0, 16, 64, dtype=np.uint32).tobytes()
        return service.chains.run(Chain(tuple(Step(source) for _ in range(n)), data, None, None))

    plain_held, gas_held = session(), session()
    print(f"life {side}x{side}, 20 generations: gas {life_chain(life, gas_held).gas}")
    rows = [
        (f"life {side}x{side}, 20 generations", lambda: life_chain(replace(life, metered=False), plain_held),
         lambda: life_chain(life, gas_held), reps),
        ("10 counting steps of 64 words", lambda: counting_chain(replace(counting, metered=False), 10),
         lambda: counting_chain(counting, 10), reps * 3),
        ("1 counting step of 64 words", lambda: counting_chain(replace(counting, metered=False), 1),
         lambda: counting_chain(counting, 1), reps * 4),
    ]
    for label, written, metered, n in rows:
        written(), metered()
        a, b = [], []
        for _ in range(n):
            for run, into in ((written, a), (metered, b)):
                started = time.perf_counter()
                run()
                into.append(time.perf_counter() - started)
        ma, mb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
        print(f"{label}: as written {ma:.2f} ms, gas form {mb:.2f} ms, {100 * (mb / ma - 1):+.1f}%")


if __name__ == "__main__":
    main()
