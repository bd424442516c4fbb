"""Wire fuzzer: malformed and mutated frames against a running port.

Frames are well framed ({packet,4} is the VM's job) but their terms are
anything: random bytes, mutations of real requests (bit flips, cuts,
insertions, splices), deep nesting, absurd declared lengths, valid ETF of
the wrong shape, valid calls with absurd arguments. Every frame must get
exactly one reply and the port must stay alive. ``python tools/fuzz.py N``
prints the figures as JSON; tests/test_faults.py runs a shorter pass.
"""

from __future__ import annotations

import json
import os
import random
import select
import struct
import subprocess
import sys
import time

import erlang

from kem_port.wire import terms
from kem_port.wire.framing import HEADER

A = terms.atom
B = terms.Binary


def seeds() -> list[bytes]:
    calls = [
        (A("call"), 1, A("ping"), ()),
        (A("call"), 2, A("execute_kernel"), (B(b"double"), B(b"\x01\x03\x05\x07"), 1)),
        (A("call"), 3, A("execute_kernel_with_params"), (B(b"pixelize"), B(bytes(64)), B(struct.pack("<4I", 4, 4, 2, 0)))),
        (A("call"), 4, A("execute"), (B(b"double"), B(bytes(16)), {A("output_size"): 8, A("workgroups"): (1, 1, 1)})),
        (A("call"), 5, A("stats"), ()),
    ]
    return [terms.encode(c) for c in calls]


ABSURD = [
    b"\x83m\xff\xff\xff\xff" + b"x" * 10,  # binary declaring 4 GiB
    b"\x83l\xff\xff\xff\xff" + b"a\x01" * 10 + b"j",  # list declaring 2^32-1 elements
    b"\x83h\xff" + b"a\x01" * 5,  # tuple of 255 with 5 elements
    b"\x83i\xff\xff\xff\xff" + b"j" * 4,  # large tuple declaring 2^32-1
    b"\x83t\xff\xff\xff\xff",  # map declaring 2^32-1 pairs
    b"\x83o\xff\xff\xff\xff\x00",  # bignum of 4 GiB digits
    b"\x83P\xff\xff\xff\xff" + b"x\x9c" + b"\x00" * 20,  # compressed, 4 GiB declared
    b"\x83" + b"h\x01" * 100000 + b"a\x00",  # nesting 100k deep
]


def absurd_calls(rng: random.Random) -> bytes:
    big = rng.choice([-1, 0, 2**31, 2**32, 2**64, 2**70])
    args = rng.choice([
        (B(b"double"), B(b"abcd"), big),
        (B(b"double"), B(b"abcd"), {A("output_size"): big}),
        (B(b"double"), B(b"abcd"), {A("workgroups"): (big, big, big)}),
        (B(b"x" * 200), B(b""), 1),
        (B(b"double"), [1, 2, 3], 1),
        (B(b"pixelize"), B(bytes(16)), B(bytes(rng.choice([1, 3, 70000])))),
        (),
        (None, None, None),
    ])
    method = rng.choice(["execute_kernel", "execute", "execute_kernel_with_params", "hello", "nope", "test_hook"])
    return terms.encode((A("call"), rng.choice([0, 7, 2**64 - 1]), A(method), args))


def mutate(frame: bytes, rng: random.Random) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and data:
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and data:
            del data[rng.randrange(len(data)) :]
        elif op == 2:
            i = rng.randrange(len(data) + 1)
            data[i:i] = os.urandom(rng.randint(1, 8))
        elif op == 3 and data:
            i = rng.randrange(len(data))
            data[i] = rng.choice([0, 0xFF, 0x6D, 0x6C, 0x68, 0x74, 0x50, 0x83])
        else:
            other = rng.choice(seeds())
            cut = rng.randrange(len(other))
            data = data[: rng.randrange(len(data) + 1)] + bytearray(other[cut:])
    return bytes(data)


def frames(n: int, rng: random.Random):
    base = seeds()
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield mutate(rng.choice(base), rng)
        elif kind == 1:
            yield os.urandom(rng.randint(0, 64)) if rng.random() < 0.5 else b"\x83" + os.urandom(rng.randint(0, 64))
        elif kind == 2:
            yield ABSURD[(i // 4) % len(ABSURD)]
        else:
            yield absurd_calls(rng)


def _read_reply(proc: subprocess.Popen, timeout: float) -> bytes | None:
    out = proc.stdout
    buf = b""
    deadline = time.monotonic() + timeout
    need = 4
    size = None
    while True:
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                return None
            chunk = os.read(out.fileno(), need - len(buf))
            if not chunk:
                return None
            buf += chunk
        if size is None:
            size = HEADER.unpack(buf[:4])[0]
            need = 4 + size
            continue
        return buf[4:]


def max_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def fuzz(n: int, seed: int | None = None, env: dict | None = None) -> dict:
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    proc = subprocess.Popen([sys.executable, "-m", "kem_port"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}, bufsize=0)
    sent = answered = errors = oks = 0
    unanswered: list[bytes] = []
    started = time.monotonic()
    try:
        for frame in frames(n, rng):
            proc.stdin.write(HEADER.pack(len(frame)) + frame)
            sent += 1
            reply = _read_reply(proc, 30.0)
            while reply is not None and terms.atom_name(erlang.binary_to_term(reply)[0]) == "log":
                reply = _read_reply(proc, 30.0)  # the port's log records (docs/protocol.md)
            if reply is None:
                unanswered.append(frame[:64])
                break
            answered += 1
            decoded = erlang.binary_to_term(reply)
            if terms.atom_name(decoded[2][0]) == "ok":
                oks += 1
            else:
                errors += 1
        alive = proc.poll() is None
        rss = max_rss_kib(proc.pid) if alive else -1
    finally:
        proc.stdin.close()
        code = proc.wait(30)
    return {"seed": seed, "frames": sent, "answered": answered, "error_replies": errors, "ok_replies": oks,
            "port_deaths": 0 if alive else 1, "exit_code": code, "max_rss_kib": rss,
            "seconds": round(time.monotonic() - started, 1), "first_unanswered": [f.hex() for f in unanswered]}


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    print(json.dumps(fuzz(count), indent=1))
