"""A request's road, counted (issue 28; docs/architecture.md, "Counting the
road"): from Router.handle_frame to the reply's write, on a real Router
and the real adapter. Each road's modules, climbs (calls up into a higher
layer: callbacks) and ups (calls and returns into a higher layer) are
held at today's figures, so a road that grows fails here; ``pytest -s``
prints each road, stop by stop."""

from __future__ import annotations

import select

import numpy as np
import pytest

from kem_port.wire import terms
from road_trace import Road, Tracer, trace
from test_reader_lone import Reader, _gpu_thread_idle, _ok_value

# Per road: most modules, climbs and ups. On 003b258 (before the layer
# packages and the one reader) the same tracer counted hot 11/0/7,
# off the hot shape 24/1/21, queued 32/1/41 (docs/architecture.md).
BOUNDS = {"hot": (13, 0, 8), "lone": (22, 1, 11), "queued": (34, 1, 40)}  # queued: 31-35 seen (the wait polls more or less)


@pytest.fixture(scope="module")
def traced():
    tracer = Tracer()
    with tracer:  # installed before the Router's GPU thread is made, so it is traced too
        reader = Reader()
        for _ in range(3):  # admitted and compiled, then the shape's kit built
            reader.call(bytes(16))
            _gpu_thread_idle(reader)
        yield reader, tracer


def call_frame(req_id: int, method: str, args: tuple) -> bytes:
    return terms.encode((terms.atom("call"), req_id, terms.atom(method), args, 60000))


def road_of(reader: Reader, tracer: Tracer, frame: bytes, req_id: int) -> tuple[Road, tuple]:
    _gpu_thread_idle(reader)
    reader.send_frame(frame)
    # Traced until the reply is in the pipe (written on the reader or the GPU thread), read after.
    road = trace(lambda: (reader.handle_next(), select.select([reader.replies_in], [], [], 30)), tracer)
    print(f"\n{road.describe()}")
    return road, reader.reply()


def check(road: Road, name: str) -> None:
    assert road.stops, "the tracer saw nothing: it cannot have counted"
    modules, climbs, ups = BOUNDS[name]
    assert len(road.modules) <= modules, road.describe()
    assert len(road.climbs) <= climbs, road.describe()
    assert len(road.ups) <= ups, road.describe()


def test_the_hot_lone_call_road(traced, rng):
    reader, tracer = traced
    data = rng.integers(0, 2**32, 4, dtype=np.uint32)
    reader.ids += 1
    args = (terms.Binary(b"double"), terms.Binary(data.tobytes()), 1)
    road, reply = road_of(reader, tracer, call_frame(reader.ids, "execute_kernel", args), reader.ids)
    assert _ok_value(reply, reader.ids) == (data * np.uint32(2)).tobytes()
    assert "kem_port.gpu.lone_road" in road.modules
    check(road, "hot")


def test_a_lone_call_off_the_hot_shape(traced, rng):
    reader, tracer = traced
    data = rng.integers(0, 2**32, 4, dtype=np.uint32)
    reader.ids += 1
    args = (terms.Binary(b"double"), terms.Binary(data.tobytes()), {terms.atom("output_size_hint"): 1})
    road, reply = road_of(reader, tracer, call_frame(reader.ids, "execute", args), reader.ids)
    assert _ok_value(reply, reader.ids) == (data * np.uint32(2)).tobytes()
    check(road, "lone")


def test_a_queued_call_road(traced, rng):
    """Explicit workgroups never run on the reader: queued, batched on the GPU thread, answered there."""
    reader, tracer = traced
    data = rng.integers(0, 2**32, 64, dtype=np.uint32)
    reader.ids += 1
    opts = {terms.atom("workgroups"): (1, 1, 1)}
    args = (terms.Binary(b"double"), terms.Binary(data.tobytes()), opts)
    road, reply = road_of(reader, tracer, call_frame(reader.ids, "execute", args), reader.ids)
    assert _ok_value(reply, reader.ids) == (data * np.uint32(2)).tobytes()
    assert "kem_port.gpu.executor" in road.modules
    check(road, "queued")


def test_the_tracer_counts_a_climb():
    """A stop into a higher layer is a climb; into a lower one it is not; a return up is an up."""
    road = Road([("kem_port.port.router", "kem_port.wire.requests"), ("kem_port.gpu.executor", "kem_port.port.intake")],
                [("kem_port.wire.requests", "kem_port.port.router")])
    assert road.climbs == [("kem_port.gpu.executor", "kem_port.port.intake")]
    assert road.ups == road.climbs + [("kem_port.wire.requests", "kem_port.port.router")]
    assert road.modules == ["kem_port.port.router", "kem_port.wire.requests", "kem_port.gpu.executor", "kem_port.port.intake"]
