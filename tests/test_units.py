"""Pure parts: framing and terms (property-based), dispatch rule, reflection."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kem_port.wire import terms
from kem_port.gpu.dispatch import DispatchLimits, plan_dispatch
from kem_port.errors import KemError
from kem_port.wire.framing import FrameWriter, OversizedFrame, read_frame
from kem_port.gpu.wgsl.wgsl_reflect import EntryPoint, reflect


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=70000), max_size=5))
def test_frames_round_trip_through_a_pipe(payloads):
    r, w = os.pipe()
    os.set_blocking(w, True)
    try:
        import threading

        writer = FrameWriter(w)
        t = threading.Thread(target=lambda: [writer.write([p[: len(p) // 2], p[len(p) // 2 :]]) for p in payloads])
        t.start()
        got = [read_frame(r, 1 << 20) for _ in payloads]
        t.join()
        assert got == payloads
    finally:
        os.close(r)
        os.close(w)


def test_oversized_frame_is_discarded_and_stream_stays_in_sync():
    r, w = os.pipe()
    try:
        os.write(w, (100).to_bytes(4, "big") + bytes(100) + (3).to_bytes(4, "big") + b"abc")
        with pytest.raises(OversizedFrame):
            read_frame(r, 50)
        assert read_frame(r, 50) == b"abc"
        os.close(w)
        w = -1
        assert read_frame(r, 50) is None
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


erl_terms = st.recursive(
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.binary(max_size=100).map(terms.Binary),
        st.sampled_from(["ok", "error", "reply", "x"]).map(terms.atom),
        st.floats(allow_nan=False),
    ),
    lambda children: st.one_of(st.lists(children, max_size=5).map(tuple), st.lists(children, max_size=5)),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(erl_terms)
def test_terms_round_trip(term):
    assert terms.decode(terms.encode(term)) == term


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**64 - 1), st.binary(max_size=5000))
def test_binary_reply_fast_path_equals_library_encoding(req_id, payload):
    fast = b"".join(bytes(p) for p in terms.ok_binary_reply(req_id, payload))
    assert fast == terms.ok_reply(req_id, payload)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**64 - 1), st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
                                                  st.binary(max_size=300), max_size=8))
def test_named_reply_fast_path_equals_library_encoding(req_id, outputs):
    fast = b"".join(bytes(p) for p in terms.ok_named_reply(req_id, outputs))
    assert fast == terms.ok_reply(req_id, {name.encode(): data for name, data in outputs.items()})


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_decode_never_raises_anything_but_kemerror(data):
    try:
        terms.decode(data)
    except KemError as exc:
        assert exc.reason == "bad_frame"


def ep(size, builtins=(), stride=None, image=False):
    return EntryPoint("main", "compute", size, "", frozenset(builtins), stride, image)


LIM = DispatchLimits(65535)


@pytest.mark.parametrize(
    "size,out,params,expected",
    [
        ((256, 1, 1), 4, (), (1, 1, 1)),
        ((256, 1, 1), 257 * 4, (), (2, 1, 1)),
        ((256, 1, 1), 1025 * 4, (), (5, 1, 1)),
        ((64, 1, 1), 3, (), (1, 1, 1)),
        ((16, 16, 1), 4 * 17 * 33, (17, 33, 5), (2, 3, 1)),
        ((16, 16, 1), 17 * 33, (17, 33), (2, 3, 1)),  # one byte a pixel
        ((16, 16, 1), 4 * 2000 * 2000, (2000, 2000), (125, 125, 1)),
        ((256, 1, 1), 4 * 256 * 65535, (), (65535, 1, 1)),
    ],
)
def test_dispatch_rule(size, out, params, expected):
    assert plan_dispatch(ep(size, image=size[1] > 1), out, params, None, LIM) == expected


@pytest.mark.parametrize("stride, out, expected", [(2, 2 * 1000, (4, 1, 1)), (16, 16 * 1000, (4, 1, 1)), (8, 8 * 256 + 1, (2, 1, 1))])
def test_the_1d_rule_counts_the_outputs_own_elements(stride, out, expected):
    """An f16 output has 2-byte elements, a vec4<f32> 16: one invocation each,
    not one per 4 bytes (half an f16 output was left unwritten before)."""
    assert plan_dispatch(ep((256, 1, 1), stride=stride), out, (), None, LIM) == expected


@pytest.mark.parametrize("size, params, image", [
    ((16, 16, 1), (), False),  # a 16x16 transpose: the 1-D rule computed 768 of 3,072 outputs
    ((16, 16, 1), (48, 64), False),  # params (rows, cols), not (width, height): the image rule crossed its axes
    ((16, 16, 1), (), True),  # an image kernel called without its width and height
    ((4, 4, 4), (8, 8, 8), True),  # 3-D: no default rule
])
def test_no_default_rule_is_guessed(size, params, image):
    with pytest.raises(KemError) as err:
        plan_dispatch(ep(size, image=image), 4 * 3072, params, None, LIM)
    assert err.value.reason == "bad_args" and "workgroups" in err.value.detail and "@workgroup_size(" in err.value.detail
    assert plan_dispatch(ep(size, image=image), 4 * 3072, params, (3, 4, 1), LIM) == (3, 4, 1)


def test_dispatch_spills_only_for_kernels_that_can_see_it():
    n = 4 * 256 * 65536
    assert plan_dispatch(ep((256, 1, 1), ["num_workgroups"]), n, (), None, LIM) == (65535, 2, 1)
    with pytest.raises(KemError) as err:
        plan_dispatch(ep((256, 1, 1)), n, (), None, LIM)
    assert err.value.reason == "dispatch_too_large"


def test_dispatch_override_and_limits():
    assert plan_dispatch(None, 4, (), (3, 2, 1), LIM) == (3, 2, 1)
    with pytest.raises(KemError):
        plan_dispatch(None, 4, (), (65536, 1, 1), LIM)
    with pytest.raises(KemError):
        plan_dispatch(ep((16, 16, 1)), 4, (16 * 70000, 1), None, LIM)
    with pytest.raises(KemError):
        plan_dispatch(ep(None), 4, (), None, LIM)
    with pytest.raises(KemError) as err:  # an image larger than its output
        plan_dispatch(ep((16, 16, 1), image=True), 64, (10**6, 10**6), None, LIM)
    assert err.value.reason == "too_large"


def test_reflection_reads_entry_points_and_bindings():
    shape = reflect(
        """
        struct P { a: u32, b: u32 }
        @group(0) @binding(0) var<storage, read> i: array<u32>;
        @group(0) @binding(1) var<storage, read_write> o: array<u32>;
        @group(0) @binding(2) var<uniform> p: P;
        fn helper(x: u32) -> u32 { return x; }
        @compute @workgroup_size(8, 4, 2)
        fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {}
        @compute @workgroup_size(0x10u) fn other() {}
        """
    )
    assert shape.entry_points["main"].workgroup_size == (8, 4, 2)
    assert shape.entry_points["main"].builtins == {"global_invocation_id", "num_workgroups"}
    assert shape.entry_points["other"].workgroup_size == (16, 1, 1)
    assert shape.entry_points["helper"].stage is None
    assert [(b.binding, b.address_space, b.access) for b in shape.bindings] == [
        (0, "storage", "read"),
        (1, "storage", "read_write"),
        (2, "uniform", ""),
    ]


def _train(sizer, cost_of, rounds=400):
    from kem_port.port.batching import BatchSizer  # noqa: F401

    for _ in range(rounds):
        n = sizer.limit()  # under load every batch arrives full
        sizer.record(n, cost_of(n) * n / 1e6, small=True)
    return sizer.limit()


def test_batch_sizer_finds_the_cliff():
    from kem_port.port.batching import BatchSizer

    # The H200's measured shape: cheaper per call up to 16, a cliff at 32.
    h200 = {1: 280, 2: 184, 4: 96, 8: 67, 16: 55, 32: 347, 64: 183, 128: 98, 256: 66}
    assert _train(BatchSizer(64), lambda n: h200[n]) == 16
    # Costs that keep falling: the cap grows to the configured maximum.
    assert _train(BatchSizer(64), lambda n: 400 / n ** 0.5) == 64
    # Large calls teach it nothing.
    sizer = BatchSizer(64)
    sizer.record(8, 1.0, small=False)
    assert sizer.cost == {}


def test_gathered_frames_wait_for_the_block_and_keep_their_order():
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    writer = FrameWriter(write_fd)
    borrowed = bytearray(b"mapped")  # stands for a mapped GPU buffer
    try:
        with writer.gathered():
            writer.write([b"first"])
            writer.write([terms.ok_binary_reply(7, memoryview(b"xy"))[0], memoryview(b"xy")])
            with pytest.raises(BlockingIOError):
                os.read(read_fd, 1)  # held, not written
            writer.write([memoryview(borrowed)])  # must go now, after what was held
            borrowed[:] = b"reused"
            writer.write([b"last"])
        os.set_blocking(read_fd, True)
        frames = [read_frame(read_fd, 1 << 20) for _ in range(4)]
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert frames[0] == b"first"
    assert terms.decode(frames[1])[1] == 7
    assert frames[2:] == [b"mapped", b"last"]


@pytest.mark.parametrize("req_id", [0, 1, 255, 256, 2**31 - 1, 2**31, 2**32, 2**64 - 1, -1, -(2**31), -(2**31) - 1])
def test_binary_reply_prefix_equals_library_encoding_at_the_integer_forms_edges(req_id):
    """The ReqId's own encoding (SMALL_INTEGER_EXT, INTEGER_EXT, else
    erlang-py) at each form's edges."""
    payload = b"\x01\x02\x03"
    fast = b"".join(bytes(p) for p in terms.ok_binary_reply(req_id, payload))
    assert fast == terms.ok_reply(req_id, payload)


@pytest.mark.parametrize("size", [0, 4, 64 * 1024, 64 * 1024 + 1, 300_000])
def test_a_reply_written_alone_is_one_whole_frame_on_either_side_of_the_one_buffer_limit(size):
    read_fd, write_fd = os.pipe()
    payload = os.urandom(size)
    writer = FrameWriter(write_fd)
    received: list = []
    reader = threading.Thread(target=lambda: received.extend(read_frame(read_fd, 1 << 20) for _ in range(2)))
    reader.start()
    try:
        writer.write_result(77, memoryview(payload))
        writer.write_result(2**40, payload)
        reader.join(30)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert received == [terms.ok_reply(77, payload), terms.ok_reply(2**40, payload)]
