"""What gas costs on the named-buffer road (issue 27): a tiled matmul by
named buffers (8 x 8 tiles: a barrier loop over tiles, an inner loop of 8
multiply-adds), run through NamedRuns (gpu/named/named_run.py: the kit,
one submission, one map) as written and as its gas form, interleaved on
one device in one process; prints the median call of each, the overhead
and the gas counted (invocations + tiles x 9 per invocation).

    .venv/bin/python scripts/gas_named_overhead.py [--n 256] [--runs 21]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np

from kem_port.config import Config
from kem_port.gpu.executor import Executor
from kem_port.gpu.named.binding_model import NamedCall
from kem_port.kernel_store import source_from_bytes
from kem_port.stats import Stats

TILED = """
struct Dims { m: u32, n: u32, k: u32 }
@group(0) @binding(0) var<storage, read> lhs: array<f32>;
@group(0) @binding(1) var<storage, read> rhs: array<f32>;
@group(1) @binding(0) var<uniform> dims: Dims;
@group(1) @binding(1) var<storage, read_write> product: array<f32>;
var<workgroup> ta: array<f32, 64>;
var<workgroup> tb: array<f32, 64>;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
  let row = g.y;
  let col = g.x;
  var sum = 0.0;
  let tiles = (dims.k + 7u) / 8u;
  for (var t = 0u; t < tiles; t++) {
    let ka = t * 8u + l.x;
    let kb = t * 8u + l.y;
    ta[l.y * 8u + l.x] = select(0.0, lhs[row * dims.k + ka], row < dims.m && ka < dims.k);
    tb[l.y * 8u + l.x] = select(0.0, rhs[kb * dims.n + col], kb < dims.k && col < dims.n);
    workgroupBarrier();
    for (var i = 0u; i < 8u; i++) { sum += ta[l.y * 8u + i] * tb[i * 8u + l.x]; }
    workgroupBarrier();
  }
  if (row < dims.m && col < dims.n) { product[row * dims.n + col] = sum; }
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="m = n = k, a multiple of 8")
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    executor = Executor(Config(), Stats())
    executor.open()
    metered = source_from_bytes("tiled", TILED.encode(), "script", "local")  # metered None: NamedRuns makes its gas form
    # As written: admission's "not metered" mark on the kernel's own text (another
    # sha256, so the two do not share a pipeline).
    plain = replace(metered, metered=False, sha256=metered.sha256 + "-as-written")
    n = args.n
    rng = np.random.default_rng()
    lhs, rhs = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    call = NamedCall("tiled", {"lhs": lhs.tobytes(), "rhs": rhs.tobytes(), "dims": np.array([n, n, n, 0], np.uint32).tobytes()},
                     {"product": 4 * n * n}, (n // 8, n // 8, 1))
    times: dict[str, list[float]] = {"as written": [], "gas form": []}
    outs = {}
    for i in range(args.runs):
        order = (("as written", plain), ("gas form", metered))
        for name, source in order if i % 2 else order[::-1]:  # interleaved: load hits both alike
            started = time.perf_counter()
            outs[name] = executor.named.run(source, call)
            times[name].append(time.perf_counter() - started)
    assert outs["as written"]["product"] == outs["gas form"]["product"]
    written, gas = (statistics.median(times[k][2:]) for k in ("as written", "gas form"))  # the first two compile
    print(f"tiled matmul {n}^3 by named buffers: as written {written * 1e3:.2f} ms, gas form {gas * 1e3:.2f} ms, "
          f"overhead {100 * (gas / written - 1):+.1f}%, gas {outs['gas form'].gas}")


if __name__ == "__main__":
    main()
