"""A request's road through kem_port, traced (docs/architecture.md, "Counting
the road"): every Python call on the reader and the GPU thread from the
moment the router gets a frame until its reply is written, reduced to the
modules it enters.

- A **stop** is a call that enters a kem_port module other than the one
  the caller's nearest kem_port frame is in (calls within a module, and
  calls into the standard library, wgpu or numpy, are not stops).
- A **climb** is a stop whose module sits in a higher layer than its
  caller's: port > wire and admission > gpu > transfer > the top-level
  basics (config, errors, stats, kernel_store). A callback handed down
  and called from below (a job's reply, run by the executor) is a climb.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

RANKS = (("kem_port.port", 5), ("kem_port.wire", 4), ("kem_port.admission", 4), ("kem_port.gpu", 3),
         ("kem_port.transfer", 2), ("kem_port", 1))


def rank(module: str) -> int:
    return next(r for prefix, r in RANKS if module == prefix or module.startswith(prefix + "."))


@dataclass
class Road:
    stops: list[tuple[str, str]] = field(default_factory=list)  # (from, to) module per stop
    returns: list[tuple[str, str]] = field(default_factory=list)  # (from, back to) per return to another module

    @property
    def modules(self) -> list[str]:
        seen = dict.fromkeys(m for pair in self.stops for m in pair)
        return list(seen)

    @property
    def climbs(self) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.stops if rank(b) > rank(a)]

    @property
    def ups(self) -> list[tuple[str, str]]:
        """Every step into a higher layer, calls and returns alike."""
        return self.climbs + [(a, b) for a, b in self.returns if rank(b) > rank(a)]

    def describe(self) -> str:
        lines = [f"{len(self.stops)} stops, {len(self.modules)} modules, {len(self.climbs)} climbs, {len(self.ups)} ups"]
        lines += [f"  {a} -> {b}" + ("  (climb)" if rank(b) > rank(a) else "") for a, b in self.stops]
        lines += [f"  {a} <- {b}  (up, returning)" for b, a in self.returns if rank(a) > rank(b)]
        return "\n".join(lines)


class Tracer:
    """Profile hooks on every thread made while it is installed, recording stops while `recording`."""

    def __init__(self) -> None:
        self.recording = False
        self.road = Road()
        self._stacks: dict[int, list[str]] = {}
        self._lock = threading.Lock()

    def hook(self, frame, event: str, _arg) -> None:
        if event not in ("call", "return"):
            return
        stack = self._stacks.setdefault(threading.get_ident(), [])
        if event == "return":
            if stack:
                left = stack.pop()
                back = next((m for m in reversed(stack) if m.startswith("kem_port")), None)
                if self.recording and left.startswith("kem_port") and back is not None and back != left:
                    with self._lock:
                        self.road.returns.append((left, back))
            return
        module = frame.f_globals.get("__name__", "")
        here = next((m for m in reversed(stack) if m.startswith("kem_port")), None)
        stack.append(module)
        if self.recording and module.startswith("kem_port") and here is not None and module != here:
            with self._lock:
                self.road.stops.append((here, module))

    def __enter__(self) -> Tracer:
        sys.setprofile(self.hook)
        threading.setprofile(self.hook)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


def trace(run: Callable[[], None], tracer: Tracer) -> Road:
    """The road `run` takes (the tracer installed before the threads it uses were made)."""
    tracer.road = Road()
    tracer.recording = True
    try:
        run()
    finally:
        tracer.recording = False
    return tracer.road
