#!/usr/bin/env python3
"""One lone small call in-process, stage by stage, every road side by side:
kem's executor as a batch of one (Executor.step, then landing: the road a
lone call took before the lone kits, and still takes where no kit fits),
the lone kit road (Executor.run_lone, gpu/lone_kit.py: what the reader
runs a lone small call on now), and the bare native calls of the same call
made through gpu/native.py with everything built once (the floor kem's
own code can reach).

Each call doubles a fresh random 4-byte input with the packaged ``double``
kernel and is checked against numpy. Interleaved, so drift in the machine's
load hits every row alike. Prints one JSON line per row: per-stage medians
(executor stages from its own stats timers), p50/p99 of the total, and with
``--gc-freeze`` how a ``gc.freeze()`` after warm-up changes the tail; then
one line with every row's p50 / p99.

``--router`` adds the whole port around the same call, in this process: a
real Router (decode, checks, intake, the reader's inline run, the reply
encoded and written by a FrameWriter to /dev/null), fed execute_kernel
frames as the node sends them through a pipe that it reads and polls as
the port does, so what the port adds around the executor shows without
Erlang; its row splits the reader's time (read, parse, intake, the
executor's road, the reply).

``--against REV`` adds the executor of another revision (``main``, a
commit, or a directory holding that revision's ``kem_port/``) in the same process, interleaved, and with ``--router`` that
revision's whole port around it too: its ``kem_port`` is exported with
``git archive`` into a temporary directory as a package of another name, so
both versions run side by side on the same adapter and load. On a shared
machine whose load swings ±50% between runs, that is the only fair
before/after.

``--spins 0,2000`` runs the executor once per spin budget (µs of
non-blocking polls before a blocking wait), interleaved in one process, to
compare waits under the same load.

Usage: scripts/bench_lone.py [--iterations N] [--spin-us N] [--spins A,B,...] [--router] [--against REV] [--gc-freeze]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import wgpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kem_port.wire import terms  # noqa: E402
from kem_port.config import Config  # noqa: E402
from kem_port.gpu.calls import Job, KernelCall  # noqa: E402
from kem_port.gpu.executor import Executor  # noqa: E402
from kem_port.kernel_store import default_stores  # noqa: E402
from kem_port.stats import Stats  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ZEROS = bytes(256)
EXECUTOR_STAGES = ("upload_encode", "submit", "gpu_wait", "readback")
# The Router row's split: the frame read off its pipe, then decoded and
# checked (and the counting around it), intake (budget, source, admission, job, inline decision), the
# executor's road without the reply, and the reply's encoding and write.
# On the reader's lone road (port/lone_call.py; lone_fold.py before) the counters after the reply's write
# are reader_after (hidden behind the reply's trip to the node); on today's
# road they are inside intake (0 there).
# Modules' places in this tree's layer packages (older trees: flat).
LAYERED = {"framing": "wire.framing", "router": "port.router", "stdio_guard": "wire.stdio_guard",
           "replies": "port.replies", "requests": "wire.requests", "lone_fold": "port.lone_fold"}
ROUTER_STAGES = ("reader_read", "reader_parse", "reader_intake", "gpu_road", "reader_reply", "reader_after")
U = wgpu.BufferUsage


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class KemLone:
    """Lone calls through the executor's batch road (Executor.step, then
    landing: a batch of one), as gpu_loop.run_inline made them before the
    lone kits, and as it still does for a call no kit takes."""

    def __init__(self, spin_us: int | None) -> None:
        self.stats = Stats()
        self.executor = Executor(Config(poll_spin_us=spin_us), self.stats)
        self.executor.open()
        self.source = default_stores(None)[0].lookup("double")
        self.stages: dict[str, list[float]] = {s: [] for s in EXECUTOR_STAGES}

    def job(self, data: bytes, got: list) -> Job:
        return Job(KernelCall("double", data, len(data)), self.source, reply=lambda v: got.append(bytes(v)), fail=got.append)

    def call(self, data: bytes, spin_s: float | None = None) -> tuple[float, bytes]:
        if spin_s is not None:
            self.executor.gpu.lone_spin_s = spin_s
        got: list = []
        job = self.job(data, got)
        before = dict(self.stats._seconds)
        started = time.perf_counter()
        flight = self.executor.step(None, [job], lone=True)
        if flight is not None:
            self.executor.step(flight, [])
        elapsed = time.perf_counter() - started
        self.record(before)
        return elapsed, got[0]

    def record(self, before: dict[str, float]) -> None:
        for stage in EXECUTOR_STAGES:
            self.stages[stage].append(self.stats._seconds[stage] - before.get(stage, 0.0))


class KitLone:
    """The same call on its lone kit (Executor.run_lone, gpu/lone_kit.py),
    the road gpu_loop.run_inline now takes for a lone small call."""

    def __init__(self, kem: KemLone) -> None:
        self.kem = kem
        self.stages: dict[str, list[float]] = {s: [] for s in EXECUTOR_STAGES}

    def call(self, data: bytes) -> tuple[float, bytes]:
        kem = self.kem
        got: list = []
        job = kem.job(data, got)
        before = dict(kem.stats._seconds)
        started = time.perf_counter()
        if not kem.executor.run_lone(job):
            raise SystemExit("the lone kit road declined the call")
        elapsed = time.perf_counter() - started
        for stage in EXECUTOR_STAGES:
            self.stages[stage].append(kem.stats._seconds[stage] - before.get(stage, 0.0))
        return elapsed, got[0]


class BareLone:
    """The same call on gpu/native.py with buffers, bind group and pipeline
    made once: write (input, zeroed output), encode (pass, dispatch, copy),
    submit, map, wait, read."""

    def __init__(self, kem: KemLone) -> None:
        self.ex = kem.executor
        device = self.ex.gpu.require()
        self.hot = self.ex.gpu.hot
        call = KernelCall("double", b"\0" * 4, 4)
        self.pipeline = self.ex.pipelines.get(device, kem.source, call)
        pool = self.ex.gpu.pool
        self.input, self.output, self.staging = pool.take("input", 256), pool.take("output", 256), pool.take("staging", 256)
        self.group = self.ex.pipelines.bind_group(device, self.pipeline, (self.input, 0, 4), (self.output, 0, 4), None)
        self.spin_s = self.ex.gpu.lone_spin_s
        self.stages: dict[str, list[float]] = {s: [] for s in ("write", "encode", "submit", "wait", "read")}

    def call(self, data: bytes) -> tuple[float, bytes]:
        t = time.perf_counter
        hot = self.hot
        t0 = t()
        hot.write(self.input, 0, data)
        t1 = t()
        hot.write(self.output, 0, ZEROS)  # as kem zeroes a small output (gpu/batch.py)
        encoder = hot.encoder()
        encoder.begin_pass()
        encoder.set_pipeline(self.pipeline.pipeline)
        encoder.set_bind_group(self.group)
        encoder.dispatch(1)
        encoder.end_pass()
        encoder.copy(self.output, 0, self.staging, 0, 256)
        commands = encoder.finish()
        t2 = t()
        index = hot.submit(commands)
        mapping = hot.map_read(self.staging, 0, 256)
        t3 = t()
        hot.wait(mapping, self.spin_s, index)
        t4 = t()
        out = bytes(hot.mapped(self.staging, 0, 256)[:4])
        hot.unmap(self.staging)
        t5 = t()
        for name, a, b in (("write", t0, t1), ("encode", t1, t2), ("submit", t2, t3), ("wait", t3, t4), ("read", t4, t5)):
            self.stages[name].append(b - a)
        return t5 - t0, out


class RouterLone:
    """The same call as a frame through a real Router on kem's executor,
    with nothing else waiting (so the reader runs it inline, as in the port).
    ``package``: the kem_port to build it from (another revision's, for
    ``--against``), with that revision's executor and stats."""

    def __init__(self, executor, stats, package: str = "kem_port") -> None:
        def load(name: str):
            """A module of this tree (layer packages) or of an older one (flat)."""
            try:
                return importlib.import_module(f"{package}.{LAYERED.get(name, name)}")
            except ModuleNotFoundError:
                return importlib.import_module(f"{package}.{name}")

        self.stats = stats
        config = executor.gpu.config
        self.sink = os.open(os.devnull, os.O_WRONLY)
        # Frames come through a pipe, read as the port reads them, and the
        # inline decision polls that pipe as the port polls its input.
        self.pipe_in, self.pipe_out = os.pipe()
        framing = load("framing")
        self.read_frame, self.header = framing.read_frame, framing.HEADER
        store = load("kernel_store")
        resolver = store.KernelResolver(store.default_stores(config.kernel_dir), None)
        writer = framing.FrameWriter(self.sink)
        try:  # this tree: answers go through one Replies (port/replies.py)
            writer = load("replies").Replies(writer, stats)
        except ModuleNotFoundError:
            pass
        self.router = load("router").Router(config, stats, executor, resolver, writer,
                                            load("stdio_guard").input_waiting(self.pipe_in),
                                            load("admission.guard").guard_from_config(config, stats))
        self.router.start()
        self.stages: dict[str, list[float]] = {s: [] for s in ROUTER_STAGES}
        self.ids = 0
        self.kit_calls = 0  # of the measured and warm-up calls, those its lone kit ran
        # The first call is admitted and compiled off the reader, then runs
        # on the GPU thread; wait until that thread is idle again, since the
        # other rows drive the same executor from this thread.
        self.router.handle_frame(self.frame(b"\0" * 4))
        deadline = time.monotonic() + 60
        while stats.count("batches") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        # Where the reader's time goes, from timed points (each adds ~0.2
        # us). Today's road: intake.submit, the executor's road (run_lone,
        # or step where the revision has no kits; the reply is written
        # inside it) and the reply's write. The reader's lone road (port/lone_call.py,
        # where the revision has it): the end of its field read, the kit's
        # call (LoneRoad.run_known) and the end of the reply's write.
        self._timed: list[float] | None = None
        self._time(self.router.intake, "submit", 0)
        self._time(executor, "run_lone" if hasattr(executor, "run_lone") else "step", 1)
        replies = getattr(self.router, "replies", None)
        self._time(replies.writer if replies is not None else self.router.writer, "write_result", 2)
        lone = getattr(self.router, "lone", None) or getattr(self.router, "fold", None)
        self.folded = lone is not None
        if self.folded:
            if hasattr(self.router, "reader"):  # this tree: the frame read once (wire/requests.py)
                self._time(load("requests"), "hot_execute_kernel", 3, end=True)
            else:
                self._time(load("lone_fold"), "execute_kernel_fields", 3, end=True)
            self._time(executor.lone, "run_known", 4)
            self._time(lone, "write_one", 5, end=True)
            self._time(executor.lone, "run_known", 6, end=True)  # wraps the timer above: when it ended

    def _time(self, owner, name: str, slot: int, end: bool = False) -> None:
        """Add a call's time to its slot (or, with `end`, note when it returned)."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if self._timed is not None:
                    now = time.perf_counter()
                    self._timed[slot] = now if end else self._timed[slot] + now - started

        setattr(owner, name, timed)

    def frame(self, data: bytes) -> bytes:
        self.ids += 1
        args = tuple(terms.to_term(a) for a in (b"double", data, 1))
        return terms.encode((terms.atom("call"), self.ids, terms.atom("execute_kernel"), args, 60000))

    def call(self, data: bytes) -> tuple[float, bytes]:
        frame = self.frame(data)
        inline = self.stats.count("inline_calls")
        kits = self.stats.count("lone_kit_calls")
        os.write(self.pipe_out, self.header.pack(len(frame)) + frame)
        self._timed = [0.0] * 7
        started = time.perf_counter()
        got = self.read_frame(self.pipe_in, 1 << 20)
        read = time.perf_counter()
        self.router.handle_frame(got)
        done = time.perf_counter()
        (submit, road, reply, parsed, known, written, known_end), self._timed = self._timed, None
        if known and written:  # the folded road: parse to the fields' end, reply from the kit's end to the write's
            reply, after = written - known_end, done - written
            parts = (read - started, parsed - read, known_end - known - parsed, known, reply, after)
        else:
            parts = (read - started, done - read - submit, submit - road, road - reply, reply, 0.0)
        for stage, seconds in zip(ROUTER_STAGES, parts):
            self.stages[stage].append(seconds)
        elapsed = done - started
        if self.stats.count("inline_calls") != inline + 1:
            raise SystemExit("the router did not run the call inline")
        self.kit_calls += self.stats.count("lone_kit_calls") - kits
        # The reply went to /dev/null; the executor's own path is checked
        # against numpy by the other rows with the same inputs.
        return elapsed, (np.frombuffer(data, dtype=np.uint32) * 2).tobytes()


class AgainstLone:
    """The same lone call through another revision's executor, imported
    from a renamed copy of its kem_port (``kem_against``)."""

    def __init__(self, rev: str, spin_us: int | None) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="kem-against-")
        package = Path(self.tmp.name) / "kem_against"
        if (Path(rev) / "kem_port").is_dir():  # a tree of that revision (a machine without the repository)
            shutil.copytree(Path(rev) / "kem_port", package, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            try:
                archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "kem_port"],
                                         check=True, capture_output=True).stdout
            except (OSError, subprocess.CalledProcessError) as exc:
                raise SystemExit(f"--against {rev}: git archive failed ({exc}); run it in a git checkout that has {rev}")
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(self.tmp.name, filter="data")
            (Path(self.tmp.name) / "kem_port").rename(package)
        for source in package.rglob("*.py"):
            source.write_text(re.sub(r"\bkem_port\b", "kem_against", source.read_text()))
        sys.path.insert(0, self.tmp.name)
        load = lambda name: importlib.import_module(f"kem_against.{name}")  # noqa: E731
        config, stats, executor, calls = load("config"), load("stats"), load("gpu.executor"), load("gpu.calls")
        self.calls = calls
        self.stats = stats.Stats()
        self.executor = executor.Executor(config.Config(poll_spin_us=spin_us), self.stats)
        self.executor.open()
        self.source = load("kernel_store").default_stores(None)[0].lookup("double")
        self.stages: dict[str, list[float]] = {}
        self.lone_kwarg = "lone" in inspect.signature(self.executor.step).parameters

    def call(self, data: bytes) -> tuple[float, bytes]:
        got: list = []
        job = self.calls.Job(self.calls.KernelCall("double", data, len(data)), self.source,
                             reply=lambda v: got.append(bytes(v)), fail=got.append)
        started = time.perf_counter()
        if self.lone_kwarg:
            flight = self.executor.step(None, [job], lone=True)
        else:  # a revision before lone calls had their own wait
            flight = self.executor.step(None, [job])
        if flight is not None:
            self.executor.step(flight, [])
        return time.perf_counter() - started, got[0]


class GcWatch:
    """Collections the garbage collector ran while watched, by generation,
    with the longest pause: is the tail the collector's?"""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._started)

    def report(self) -> dict:
        return {f"gen{g}": [len(p), round(max(p, default=0) * 1e6, 1)] for g, p in self.pauses.items()}


def summary(name: str, totals: list[float], stages: dict[str, list[float]], extra: dict) -> dict:
    result = {"path": name, **extra, "calls": len(totals)}
    for stage, values in stages.items():
        result[f"{stage}_p50_us"] = round(statistics.median(values) * 1e6, 1)
    for stage, values in stages.items():  # which stage makes the tail
        result[f"{stage}_p99_us"] = round(percentile(values, 0.99) * 1e6, 1)
    result["total_p50_us"] = round(statistics.median(totals) * 1e6, 1)
    result["total_p99_us"] = round(percentile(totals, 0.99) * 1e6, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--spin-us", type=int, default=None, help="KEM_POLL_SPIN_US; default: kem's lone-call spin by adapter (100 on CPU, 2000 on GPUs)")
    parser.add_argument("--spins", default="", help="comma-separated spin budgets (µs) for the executor, interleaved")
    parser.add_argument("--router", action="store_true", help="add the whole port around the call (a real Router, replies to /dev/null)")
    parser.add_argument("--against", default="", help="a git revision whose executor runs interleaved (before/after)")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after warm-up (as the port does at start)")
    args = parser.parse_args()
    kem = KemLone(args.spin_us)
    bare = BareLone(kem)
    spins = [int(v) for v in args.spins.split(",") if v.strip()]
    paths: dict = {"kem executor (batch road)": kem, "lone kit": KitLone(kem), "bare native": bare}
    if spins:
        paths = {f"kem executor spin {v} us": (kem, v / 1e6) for v in spins} | {"bare native": bare}
    if args.router:
        paths["port in-process (router)"] = RouterLone(kem.executor, kem.stats)
    if args.against:
        against = paths[f"executor at {args.against}"] = AgainstLone(args.against, args.spin_us)
        if args.router:
            paths[f"port in-process at {args.against}"] = RouterLone(against.executor, against.stats, "kem_against")
    totals: dict[str, list[float]] = {name: [] for name in paths}
    rng = np.random.default_rng()
    watch = GcWatch()
    warmup = max(args.iterations // 10, 50)
    for n in range(warmup + args.iterations):
        if n == warmup:
            blocked_before = kem.stats.count("gpu_waits_blocked")
            for path in paths.values():
                for values in getattr(path, "stages", {}).values():
                    values.clear()
            if args.gc_freeze:
                gc.collect()
                gc.freeze()
            gc.callbacks.append(watch)
        data = rng.integers(0, 2**31, 1, dtype=np.uint32).tobytes()
        want = (np.frombuffer(data, dtype=np.uint32) * 2).tobytes()
        for name, path in paths.items():
            elapsed, got = path[0].call(data, path[1]) if isinstance(path, tuple) else path.call(data)
            if got != want:
                raise SystemExit(f"{name}: wrong result {got!r} for {data!r}")
            if n >= warmup:
                totals[name].append(elapsed)
    gc.callbacks.remove(watch)
    extra = {
        "adapter": kem.executor.info.get("name", "?"), "hot_path": kem.executor.info.get("hot_path"),
        "spin_us": round(kem.executor.gpu.lone_spin_s * 1e6), "gc_freeze": args.gc_freeze,
        # kem's calls (all rows that use its executor) whose wait ended in a blocking poll
        "kem_waits_blocked": kem.stats.count("gpu_waits_blocked") - blocked_before,
        "gc_collections_and_longest_us": watch.report(),  # over the whole measured run, all rows
    }
    rows = []
    for name, path in paths.items():
        stages = {} if isinstance(path, tuple) else path.stages  # stage timers are shared when interleaving spins
        mine = extra | ({"kit_calls": path.kit_calls} if isinstance(path, RouterLone) else {})
        rows.append(summary(name, totals[name], stages, mine))
        print(json.dumps(rows[-1]), flush=True)
    # One line a person reads: every row's p50 / p99 in µs.
    print("# p50 / p99 us: " + "; ".join(f"{r['path']} {r['total_p50_us']:.0f} / {r['total_p99_us']:.0f}" for r in rows), flush=True)


if __name__ == "__main__":
    main()
