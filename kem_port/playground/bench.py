"""What the playground's page asks of kem: check a text, run it.

One Bench holds one ``kem_port.api.Runner`` (one device, its compiled
pipelines, the admission guard's warm worker) for the server's life: the
first Run opens the device, every later one is warm. Every step is the
API's and the CLI's own: a check is ``kem check``'s report
(cli/check_cmd.build_report), a run is ``Runner.call``/``execute`` (the
kem@1.0 contract) or ``run_named`` (any kernel by named buffers), and every
kernel is admitted as the port admits it (the sacrificial compile). One
request at a time (a lock): the device serves one author.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import io
import threading
import time
from types import SimpleNamespace
from typing import Any, Iterator

from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.kernel_store import source_from_bytes
from kem_port.playground import payload
from kem_port.playground.diagnostics import diagnostics

KERNEL_ID = "playground"  # the id the editor's text runs under (logs and errors)
SHOWN_BYTES = 4096  # of each output, sent to the page as hex; the rest is counted and hashed
MAX_CHECK_INPUT = 1 << 30  # bytes: check only sizes a dispatch, nothing is allocated
# How long a request waits for the device while another holds it. A Run is
# bounded by its gas, not by time: a looping kernel over 2^18 invocations
# ran 24.5 s on lavapipe (KEM_GAS_LIMIT 2^34; ~8 s under KEM_GAS_TURNS'
# 60,000 turns a lane), and the editor's check
# waited 23 s behind it (red team, tests/test_red_team_faces.py). A quick
# Run ends well within this; past it the request is answered `overloaded`
# (503) and the page's next check or Run asks again.
BUSY_WAIT_S = 2.0


class Bench:
    def __init__(self, config: Config | None = None) -> None:
        from kem_port.api import Runner

        # Timestamps on every call where the adapter has them: an author
        # wants the GPU time of this Run, not one batch in 16 (the port's auto).
        config = dataclasses.replace(config or Config.from_env(), gpu_timing="on")
        self.runner = Runner(config=config)
        self.limit = config.max_input_bytes
        self._lock = threading.Lock()

    def close(self) -> None:
        self.runner.close()

    # -- check -------------------------------------------------------------

    def check(self, body: dict) -> dict:
        """``kem check``'s report for the editor's text, and its diagnostics placed at line:column."""
        from kem_port.cli.check_cmd import build_report
        from kem_port.cli.console import Console

        text, shape = payload.code(body), payload.shape(body, self.limit)
        size = body.get("input_size", 4096)
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_CHECK_INPUT:
            raise KemError("bad_args", f"input_size: 0 to {MAX_CHECK_INPUT} bytes")
        image = _image(body.get("image"))
        with self._turn():
            try:
                source = self._source(text)
                params = payload.params_bytes(shape.params, image)
                # debug: a kernel with the debug channel (@binding(15)) is a kem@1.0 kernel here, as Run calls it
                args = SimpleNamespace(input_size=size, debug=True, **dataclasses.asdict(shape))
                report = build_report(self.runner, source, args, params, Console(quiet=True))
            except KemError as exc:
                return {"ok": False, "diagnostics": diagnostics(exc.reason, exc.detail), "report": None}
        runs = report["ok"] or report["named"]["ok"]
        found = [] if runs else diagnostics(report["reason"], report["error"])
        return {"ok": runs, "mode": "kem" if report["ok"] else "named", "diagnostics": found, "report": report}

    # -- run ---------------------------------------------------------------

    def run(self, body: dict) -> dict:
        """One Run: the outputs (hex, an image when image-shaped), the dispatch rule, timings, debug records."""
        text, shape = payload.code(body), payload.shape(body, self.limit)
        mode = body.get("mode", "kem")
        if mode not in ("kem", "named"):
            raise KemError("bad_args", "mode: kem (the kem@1.0 contract) or named (buffers by name)")
        with self._turn():
            runner = self.runner
            runner.timings = type(runner.timings)()
            gpu_before = _gpu_seconds(runner)
            source = self._source(text)
            if mode == "kem":
                answer = self._run_kem(source, shape, body)
            else:
                answer = self._run_named(source, shape, body)
            timings = {k: round(v * 1e3, 3) for k, v in vars(runner.timings).items()}
            gpu = _gpu_seconds(runner) - gpu_before
        if mode == "named":
            del timings["compile"]  # a named run compiles inside run_named: its time is in "run"
        answer.update(timings_ms=timings, gpu_ms=round(gpu * 1e3, 3) if gpu > 0 else None,
                      gpu_note=None if gpu > 0 else _no_gpu_time(mode, bool(body.get("debug"))),
                      warm=timings.get("device_open", 0) == 0, adapter=runner.executor.info.get("name"))
        return answer

    def _run_kem(self, source, shape: payload.Shape, body: dict) -> dict:
        runner = self.runner
        loaded = payload.load(body.get("input"), self.limit, "input")
        debug = bool(body.get("debug"))
        call = runner.call(
            source, loaded.data, output_size=shape.output_size, hint=shape.hint,
            params=payload.params_bytes(shape.params, loaded.image_size), workgroups=shape.workgroups,
            entry_point=shape.entry_point, debug=debug, grid=shape.grid, constants=dict(shape.constant) or None,
        )
        runner.compile(source, call)
        rule, groups = runner.dispatch_rule(source, call), runner.dispatch(source, call)
        records = None
        if debug:
            result, records = runner.execute_debug(source, call)
        else:
            result = runner.execute(source, call)
        return {"ok": True, "dispatch_rule": rule, "workgroups": list(groups), "debug": records,
                "input": {"bytes": len(loaded.data), "image": loaded.image_size},
                "outputs": [_view("output", result, loaded.image_size)]}

    def _run_named(self, source, shape: payload.Shape, body: dict) -> dict:
        from kem_port.api import run_named

        if shape.grid is None and shape.workgroups is None:
            raise KemError("bad_args", "a kernel run by named buffers needs a grid or workgroups")
        buffers, outputs = payload.named(body, self.limit)
        image = next((b.image_size for b in buffers.values() if b.image_size), None)
        started = time.perf_counter()
        got = run_named(source.kernel_id, {n: b.data for n, b in buffers.items()}, outputs,
                        runner=_Pinned(self.runner, source), workgroups=shape.workgroups, grid=shape.grid,
                        constants=dict(shape.constant) or None, entry_point=shape.entry_point)
        self.runner.timings.run = time.perf_counter() - started
        return {"ok": True, "dispatch_rule": "grid" if shape.grid else "workgroups",
                "workgroups": list(shape.workgroups) if shape.workgroups else None, "debug": None,
                "input": {"bytes": sum(len(b.data) for b in buffers.values()), "image": image},
                "outputs": [_view(name, array.tobytes(), image) for name, array in got.items()]}

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """The device, one request at a time; `overloaded` rather than waiting on a long Run."""
        if not self._lock.acquire(timeout=BUSY_WAIT_S):
            raise KemError("overloaded", "a Run is still running on this device (it is bounded by its gas, "
                           "KEM_GAS_LIMIT); this request was not started: try again when it ends")
        try:
            yield
        finally:
            self._lock.release()

    def _source(self, text: str):
        return source_from_bytes(KERNEL_ID, text.encode("utf-8"), KERNEL_ID, "local")


class _Pinned:
    """The Runner as run_named sees it, its ``source()`` answering the
    editor's text (run_named resolves a kernel by path or id; the editor's
    text is neither)."""

    def __init__(self, runner: Any, source: Any) -> None:
        self._runner, self._source = runner, source

    def source(self, kernel: Any) -> Any:
        return self._source

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


def _no_gpu_time(mode: str, debug: bool) -> str:
    """Why a run has no GPU time: only the batch road takes timestamps (gpu/timing.py)."""
    if mode == "named":
        return "runs by named buffers take no GPU timestamps"
    if debug:
        return "debug runs take no GPU timestamps"
    return "the adapter has no timestamp queries"


def _view(name: str, data: bytes, image: tuple[int, int] | None) -> dict:
    shown = data[:SHOWN_BYTES]
    view = {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "hex": shown.hex(),
            "png": None}
    if image is not None and len(data) == image[0] * image[1] * 4:
        view["png"] = _png(data, image)
    return view


def _png(data: bytes, size: tuple[int, int]) -> str | None:
    try:
        from PIL import Image
    except ImportError:
        return None  # the hex view still shows it
    buf = io.BytesIO()
    Image.frombytes("RGBA", size, data).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _image(value: Any) -> tuple[int, int] | None:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and 0 < v < 1 << 16 for v in value):
        return value[0], value[1]
    return None


def _gpu_seconds(runner: Any) -> float:
    """GPU timestamps so far (executor's ``gpu_kernel`` time); 0 where the adapter has none."""
    return runner.stats.snapshot().get("gpu_kernel_us", 0) / 1e6
