#!/usr/bin/env python3
"""Measure erlang-py, erlpack and the narrow request decoder on kem's own frames (docs/codec.md).

Usage: .venv/bin/python scripts/bench_codec.py   (needs the test extra: erlpack)
Prints a table; no timed assertions.
"""

from __future__ import annotations

import statistics
import time

import erlang
import erlpack

from kem_port.wire import terms
from kem_port.wire.request_fast import decode_hot


def best_of(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def request(n: int) -> bytes:
    return erlang.term_to_binary(
        (terms.atom("call"), 7, terms.atom("execute_kernel"), (terms.Binary(b"double"), terms.Binary(bytes(n)), 1))
    )


def main() -> None:
    rows = []
    for label, n, rep in (("4 B", 4, 2000), ("1 MiB", 1 << 20, 50), ("64 MiB", 64 << 20, 5)):
        frame = request(n)
        payload = bytes(n)
        rows.append(
            (
                label,
                best_of(lambda: erlang.binary_to_term(frame), rep),
                best_of(lambda: erlpack.unpack(frame), rep),
                best_of(lambda: decode_hot(frame), rep),
                best_of(lambda: terms.ok_reply(7, payload), rep),
                best_of(lambda: erlpack.pack((erlpack.Atom("reply"), 7, (erlpack.Atom("ok"), payload))), rep),
                best_of(lambda: terms.ok_binary_reply(7, payload), rep),
            )
        )
    print(f"{'payload':>8} | {'decode erlang-py':>16} | {'decode erlpack':>14} | {'decode narrow':>14} | {'encode erlang-py':>16} | {'encode erlpack':>14} | {'encode fast path':>16}")
    for label, *times in rows:
        print(f"{label:>8} | " + " | ".join(f"{t * 1e6:>13.1f} us" for t in times))
    # Strictness on a truncated request: a codec that accepts it would run a
    # kernel on part of the caller's input.
    frame = request(100)
    cut = frame[:-10]
    narrow = ("narrow (request_fast)", decode_hot)
    for name, decode in (("erlang-py", erlang.binary_to_term), ("erlpack", erlpack.unpack), narrow):
        try:
            got = decode(cut)
            if got is None:
                raise ValueError("left to erlang-py")
            length = len(got[3][1].value if hasattr(got[3][1], "value") else got[3][1])
            print(f"{name}: truncated frame ACCEPTED, input of {length} bytes instead of 100")
        except Exception as exc:
            print(f"{name}: truncated frame refused ({type(exc).__name__})")
    for name, decode in (("erlang-py", erlang.binary_to_term), ("erlpack", erlpack.unpack), narrow):
        try:
            if decode(frame + b"junk") is None:
                raise ValueError("left to erlang-py")
            print(f"{name}: trailing bytes ACCEPTED")
        except Exception as exc:
            print(f"{name}: trailing bytes refused ({type(exc).__name__})")


if __name__ == "__main__":
    main()
