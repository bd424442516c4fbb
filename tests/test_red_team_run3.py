"""Red team of this session's new surfaces (issue 25's named calls): the
narrow decoder's maps, the plan cached per call signature and the spliced
reply, through a real port on real wgpu. (tests/test_red_team3.py is an
earlier red team's; dev_kem chains: erlang/kem/test/kem_red_team3_tests.erl.)

Findings (each test below failed before its fix):
* a constants set's cache key (gpu/constants.set_key) compared the values
  with Python's ==, which takes 0 == -0.0 and 1 == 1.0, and kept the float
  signs apart from their names: {A => 0, B => -0.0} and {A => -0.0, B => 0}
  were one key, so the second caller ran the first caller's pipeline (A and
  B swapped signs: bitcast told), and {N => 1.0} for a u32 override ran as a
  cached {N => 1} instead of being refused (the plan skips its checks);
* the narrow decoder read a SMALL_BIG whose sign byte is 2..255 as negative
  where erlang-py, the judge, reads it positive: one frame, two values;
* a map holding 0 and false (or 1 and true, or 0 and 0.0) as keys is two
  keys in Erlang and one in Python (False == 0): both decoders kept one, so
  kem:run/3's #{0 => A, false => B} ran with B bound at binding 0 and no
  word said so.
  etf_guard now refuses a map key true, false or a float (bad_frame, to the
  caller), and the narrow decoder leaves such a map to it;
* a chain step's constants naming an override its kernel lacks raised
  KeyError in the compile guard's admission (`internal`, a 500);
* a batch of named calls (gpu_loop gathers one kernel's) with more shapes
  than the 16 kits kept released its own earlier kits while planning its
  later calls, and a batch-mate's gpu_error on a shape over 4 MiB dropped
  the batch's kits: every call of the batch a gpu_error;
* kept plans and kits held their first caller's bytes (250 MiB for 64
  calls of 3 MiB; a caller's bytes stayed in the port);
* one override given twice (by name and @id, or atom and binary) ran with
  one of the two values, unsaid;
* "$" matched before a trailing newline: a chain buffer named "c2\n"; and
  warm's prefix match let "sub/../../outside/evil" reach the kernel store.

Held (regression tests): see each test's docstring.
"""

from __future__ import annotations

import struct

import erlang
import numpy as np
import pytest

from conftest import kernels_port, start_port
from test_red_team_named import run  # the run method, names as binaries
from kem_port.client import PortError
from kem_port.wire import terms
from kem_port.wire.narrow_decode import decode_hot

KERNELS = {
    # each override's bits: which constants set the pipeline was built with
    "signs": """
override A: f32;
override B: f32;
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { out[0] = bitcast<u32>(A); out[1] = bitcast<u32>(B); }
""",
    "signs_positional": """
override A: f32;
override B: f32;
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(1)
fn main() { b[0] = bitcast<u32>(A) + a[0]; b[1] = bitcast<u32>(B) + a[1]; }
""",
    "typed": """
override N: u32;
override F: f32;
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { out[0] = N; out[1] = bitcast<u32>(F); }
""",
    # out = a + 1, binding 0 read and binding 1 written
    "inc": """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&out)) { out[i] = a[i] + 1u; }
}
""",
}


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("red_run3"), KERNELS) as p:
        yield p


def words(data: bytes) -> list[int]:
    return list(np.frombuffer(data, np.uint32))


# -- constants sets: one key per set, as WGSL tells them apart --------------

NEG = 0x80000000  # -0.0's bits


def test_two_callers_whose_zeros_differ_only_in_sign_get_their_own_pipelines(port):
    """BEFORE: {A => 0, B => -0.0} and {A => -0.0, B => 0} were one cache
    key ((A, 0), (B, -0.0)) == ((A, -0.0), (B, 0)), and one float sign each:
    the second caller got [0, 0x80000000], the first caller's signs."""
    cases = [({"A": 0, "B": -0.0}, [0, NEG]), ({"A": -0.0, "B": 0}, [NEG, 0]),
             ({"A": 0.0, "B": -0.0}, [0, NEG]), ({"A": -0.0, "B": 0.0}, [NEG, 0]), ({"A": 0, "B": 0}, [0, 0])]
    for _ in range(2):  # cold, then every plan and pipeline cached
        for constants, want in cases:
            got = run(port, "signs", {}, outputs={"out": 8}, workgroups=(1, 1, 1), constants=constants)
            assert words(got["out"]) == want, constants


def test_a_float_for_a_u32_override_is_refused_after_a_cached_integer_call(port):
    """BEFORE: {N => 1, F => 2.0} cached a plan; {N => 1.0, F => 2} had the
    same key and ran on it, where a cold call of it is bad_args (u32: an integer)."""
    got = run(port, "typed", {}, outputs={"out": 8}, workgroups=(1, 1, 1), constants={"N": 1, "F": 2.0})
    assert words(got["out"]) == [1, 0x40000000]
    for _ in range(2):
        with pytest.raises(PortError) as err:
            run(port, "typed", {}, outputs={"out": 8}, workgroups=(1, 1, 1), constants={"N": 1.0, "F": 2})
        assert err.value.reason == "bad_args" and "N is a u32" in err.value.detail, err.value
    got = run(port, "typed", {}, outputs={"out": 8}, workgroups=(1, 1, 1), constants={"N": 7, "F": 2})
    assert words(got["out"]) == [7, 0x40000000]


def test_the_execute_road_keeps_sign_swapped_sets_apart_too(port):
    """The same key served execute's pipeline cache (gpu/pipelines.py): the
    second set got the first's pipeline there too."""
    for _ in range(2):
        for constants, want in (({"A": 0, "B": -0.0}, [0, NEG]), ({"A": -0.0, "B": 0}, [NEG, 0])):
            got = port.call("execute", b"signs_positional", bytes(8), {"constants": constants})
            assert words(got) == want, constants


# -- the narrow decoder: erlang-py's values or none ----------------------------

def small_big(value: int, sign: int) -> bytes:
    digits = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "little")
    return b"n" + bytes([len(digits), sign]) + digits


@pytest.mark.parametrize("sign", [0, 1, 2, 127, 255])
def test_a_small_big_reads_as_erlang_py_reads_it_whatever_its_sign_byte(sign):
    """BEFORE: sign byte 2 read -5 on the narrow road, 5 through erlang-py."""
    for frame in (b"\x83" + small_big(5, sign),
                  b"\x83h\x02" + small_big(5, sign) + small_big(1 << 40, sign),
                  b"\x83t\x00\x00\x00\x01w\x09gas_limit" + small_big(300, sign)):
        hot = decode_hot(frame)
        assert hot is None or erlang.term_to_binary(hot) == erlang.term_to_binary(erlang.binary_to_term(frame))
        assert erlang.term_to_binary(terms.decode_request(frame)) == erlang.term_to_binary(erlang.binary_to_term(frame))


# -- map keys Python takes as equal ------------------------------------------------

def run_frame(req_id: int, buffers: bytes, opts: bytes) -> bytes:
    """{call, ReqId, run, {<<"inc">>, Buffers, Opts}, 60000} with Buffers and Opts as bytes."""
    head = b"\x83h\x05" + b"".join(terms.encode(t)[1:] for t in (terms.atom("call"), req_id, terms.atom("run")))
    args = b"h\x03" + terms.encode(terms.Binary(b"inc"))[1:] + buffers + opts
    return head + args + terms.encode(60000)[1:]


def map_of(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return b"t" + struct.pack(">I", len(pairs)) + b"".join(k + v for k, v in pairs)


def binary(data: bytes) -> bytes:
    return b"m" + struct.pack(">I", len(data)) + data


OPTS = map_of([(terms.encode(terms.atom("workgroups"))[1:], terms.encode((1, 1, 1))[1:]),
               (terms.encode(terms.atom("outputs"))[1:], map_of([(binary(b"out"), b"a\x10")]))])
A_BYTES, B_BYTES = np.arange(4, dtype=np.uint32).tobytes(), np.arange(100, 104, dtype=np.uint32).tobytes()


@pytest.mark.parametrize("second_key", [b"w\x05false", b"d\x00\x05false", b"F" + struct.pack(">d", 0.0)])
def test_a_binding_number_and_a_key_python_equates_with_it_are_refused_not_merged(port, second_key):
    """BEFORE: #{0 => A, false => B} (two keys in Erlang, kem:run/3 sends it
    as is) decoded to {0: B}: B ran at binding 0 and A went unread, no word
    (out came back B + 1). Likewise 0.0. Now bad_frame, answered to the
    caller; the port lives."""
    for req_id, buffers in ((7001, map_of([(b"a\x00", binary(A_BYTES)), (second_key, binary(B_BYTES))])),
                            (7002, map_of([(second_key, binary(B_BYTES)), (b"a\x00", binary(A_BYTES))]))):
        frame = run_frame(req_id, buffers, OPTS)
        (fut,) = port.call_raw_frame(frame, [req_id])
        with pytest.raises(PortError) as err:
            fut.result(60)
        assert err.value.reason == "bad_frame", err.value
        assert "map key" in err.value.detail and "Otp" not in err.value.detail
    got = run(port, "inc", {0: A_BYTES}, outputs={"out": 16}, workgroups=(1, 1, 1))
    assert words(got["out"]) == [1, 2, 3, 4]


def test_true_false_and_float_map_keys_never_take_the_narrow_road():
    for key in (b"w\x04true", b"w\x05false", b"s\x04true", b"F" + struct.pack(">d", 0.0)):
        assert decode_hot(b"\x83" + map_of([(key, b"a\x01")])) is None
    assert decode_hot(b"\x83" + map_of([(b"w\x09undefined", b"a\x01")])) == {None: 1}  # erlang-py's None: no clash


# -- the plan cached per signature: a call sees only its own bytes ---------------

REVEAL = """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> io: array<u32>;
@group(1) @binding(0) var<storage, read_write> seen: array<u32>;
@group(1) @binding(1) var<storage, read_write> partial: array<u32>;
@compute @workgroup_size(1)
fn main() {
    let na = arrayLength(&a);
    let nio = arrayLength(&io);
    seen[0] = na;
    seen[1] = nio;
    for (var i = 0u; i < na; i++) { seen[2u + i] = a[i]; }
    for (var i = 0u; i < nio; i++) { seen[2u + na + i] = io[i]; io[i] = ~io[i]; }
    partial[0] = 7u;
}
"""
KERNELS["reveal"] = REVEAL
SEEN_WORDS = 32  # 2 lengths + at most 15 words of a + 15 of io


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 4)


def reveal_expected(a: bytes, io: bytes, partial_size: int) -> dict[str, bytes]:
    pa, pio = padded(a), padded(io)
    seen = np.zeros(SEEN_WORDS, np.uint32)
    seen[:2] = len(pa) // 4, len(pio) // 4
    body = np.frombuffer(pa + pio, np.uint32)
    seen[2 : 2 + len(body)] = body
    partial = np.zeros(partial_size // 4, np.uint32)
    partial[0] = 7
    return {"seen": seen.tobytes(), "partial": partial.tobytes(), "io": bytes(b ^ 0xFF for b in io)}


A_KEYS, IO_KEYS = ("a", "0/0", 0), ("io", "0/1", 1)
SEEN_KEYS, PARTIAL_KEYS = ("seen", "1/0"), ("partial", "1/1")


def test_calls_of_shared_kits_and_evicted_plans_see_only_their_own_bytes(port):
    """Held: 160 calls of one kernel whose every binding is read whole by
    the kernel (arrayLength, padding included): lengths 1..60 bytes (so
    21..24 share a kit), each buffer under its name, "G/B" or binding
    number, 20 output sizes of `partial` (more shapes than the 16 kits kept,
    more signatures than the 64 plans kept: evicted and re-made), random
    bytes each call. Each came back exactly: its own bytes, zeros where a
    binding is padded or an output unwritten, never a previous caller's."""
    rng = np.random.default_rng(2503)
    for _ in range(160):
        a = rng.integers(0, 256, int(rng.integers(1, 61)), dtype=np.uint8).tobytes()
        io = rng.integers(0, 256, int(rng.integers(1, 61)), dtype=np.uint8).tobytes()
        partial = 4 * int(rng.integers(1, 21))
        keys = [A_KEYS[rng.integers(3)], IO_KEYS[rng.integers(3)], SEEN_KEYS[rng.integers(2)], PARTIAL_KEYS[rng.integers(2)]]
        got = run(port, "reveal", {keys[0]: a, keys[1]: io}, outputs={keys[2]: 4 * SEEN_WORDS, keys[3]: partial},
                  workgroups=(1, 1, 1))
        assert got == reveal_expected(a, io, partial), (len(a), len(io), partial, keys)
    stats = {terms.atom_name(k): v for k, v in port.call("stats").items()}
    assert stats["named_calls"] >= 160


def test_one_binding_given_twice_under_two_of_its_names_is_refused_after_a_cached_call(port):
    """Held: a cached plan for {a => X} is not reached by {a => X, "0/0" => Y}
    (its signature differs); that call is refused naming the binding, not
    run with either buffer."""
    run(port, "reveal", {"a": b"\1" * 8, "io": b"\2" * 8}, outputs={"seen": 128, "partial": 4}, workgroups=(1, 1, 1))
    for extra in ("0/0", 0):
        with pytest.raises(PortError) as err:
            run(port, "reveal", {"a": b"\1" * 8, extra: b"\3" * 8, "io": b"\2" * 8}, outputs={"seen": 128, "partial": 4},
                workgroups=(1, 1, 1))
        assert err.value.reason == "bad_args" and "Otp" not in err.value.detail, err.value


# A uniform whose size reflection may not read (an array sized by a const
# expression): given too few bytes, wgpu refuses the dispatch.
KERNELS["uni_const"] = """
const K = 8u;
const N = K * 8u;
struct U { v: array<vec4<u32>, N> }
@group(0) @binding(0) var<uniform> u: U;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { for (var i = 0u; i < 256u; i++) { out[i] = u.v[i / 4u][i % 4u]; } }
"""


def test_a_gpu_error_then_repeats_of_both_signatures_each_get_their_own_answer(port):
    """Held: a call wgpu refuses (16 bytes for a 1 KiB uniform, if kem cannot
    size it first) is a structured refusal; its kits are dropped, and
    repeats of the good and the bad signature, interleaved, answer each
    exactly (the good one its own random words, never a stale kit)."""
    rng = np.random.default_rng(7)
    for _ in range(3):
        with pytest.raises(PortError) as err:
            run(port, "uni_const", {"u": bytes(16)}, outputs={"out": 1024}, workgroups=(1, 1, 1))
        assert err.value.reason in ("gpu_error", "bad_args"), err.value
        assert "Traceback" not in err.value.detail and ".py" not in err.value.detail
        data = rng.integers(0, 2**32, 256, dtype=np.uint32)
        got = run(port, "uni_const", {"u": data.tobytes()}, outputs={"out": 1024}, workgroups=(1, 1, 1))
        assert np.array_equal(np.frombuffer(got["out"], np.uint32), data)
    assert port.call("ping") == terms.atom("pong")


# Loops flag[0] times: its gas is the caller's data.
KERNELS["loops"] = """
@group(0) @binding(0) var<storage, read> flag: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() {
    var x = 0u;
    for (var i = 0u; i < flag[0]; i++) { x += i; }
    out[0] = x;
}
"""


def loops(port, turns: int, gas_limit: int | None) -> tuple[int, int]:
    opts = {"outputs": {b"out": 4}, "workgroups": (1, 1, 1), "usage": True}
    if gas_limit is not None:
        opts["gas_limit"] = gas_limit
    outputs, usage = port.call("run", b"loops", {b"flag": np.uint32(turns).tobytes()}, opts)
    (out,) = outputs.values()
    return int(np.frombuffer(terms.binary_bytes(out), np.uint32)[0]), {terms.atom_name(k): v for k, v in usage.items()}["gas"]


def test_a_cached_plans_meter_counts_each_call_from_zero_and_takes_each_limit(port):
    """Held: one signature called again and again never inherits the last
    call's meter (ten calls of 90 turns each under a budget of ~100 all run,
    each the same gas); the same kit under another gas_limit takes that
    call's cap, and the first limit's plan still ends a runaway."""
    first = loops(port, 90, 100)
    assert first[0] == sum(range(90))
    for _ in range(10):
        assert loops(port, 90, 100) == first
    for turns, limit in ((5000, 100), (5000, 10_000), (5000, 100), (90, 100), (5000, 10_000)):
        if turns > limit:
            with pytest.raises(PortError) as err:
                loops(port, turns, limit)
            assert err.value.reason == "gas_exhausted", err.value
        else:
            assert loops(port, turns, limit)[0] == sum(range(turns)) % 2**32


def test_a_shape_over_the_kept_kit_size_runs_fresh_each_call(port):
    """Held: 5 MiB in and out (over KIT_BYTES, 4 MiB: never kept) twice with
    different random words, then a small call of the same kernel: each is
    exactly a + 1 of its own words."""
    rng = np.random.default_rng(11)
    for n in ((5 << 20) // 4, (5 << 20) // 4, 1000):
        a = rng.integers(0, 2**32 - 1, n, dtype=np.uint32)
        got = run(port, "inc", {"a": a.tobytes()}, outputs={"out": 4 * n}, grid=(n, 1, 1))
        assert np.array_equal(np.frombuffer(got["out"], np.uint32), a + 1)


KERNELS["names"] = """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> Z9: array<u32>;
@group(0) @binding(2) var<storage, read_write> a_1: array<u32>;
@group(0) @binding(3) var<storage, read_write> résultat: array<u32>;
@group(1) @binding(0) var<storage, read_write> o4: array<u32>;
@group(1) @binding(1) var<storage, read_write> o5: array<u32>;
@group(2) @binding(0) var<storage, read_write> o6: array<u32>;
@group(3) @binding(7) var<storage, read_write> o7: array<u32>;
@compute @workgroup_size(1)
fn main() {
    Z9[0] = inp[0] + 1u; a_1[0] = inp[0] + 2u; résultat[0] = inp[0] + 3u;
    o4[0] = inp[0] + 4u; o5[0] = inp[0] + 5u; o6[0] = inp[0] + 6u; o7[0] = inp[0] + 7u;
}
"""
KERNELS["unicode"] = KERNELS["names"]
KERNELS["names"] = KERNELS["names"].replace("r\u00e9sultat", "r_sultat_")
KERNELS["reads_only"] = """
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@compute @workgroup_size(1)
fn main() { let x = inp[0]; }
"""


def test_the_spliced_reply_carries_seven_outputs_a_unicode_name_and_none(port):
    """Held: the hand-encoded reply (terms.ok_named_reply) with the 7
    outputs WebGPU's 8 storage buffers leave beside an input (a kernel with
    no output is refused, bad_kernel: no empty reply); a WGSL name outside ASCII never reaches
    the reply: kem refuses the kernel (bad_kernel, its line and column)."""
    rng = np.random.default_rng(5)
    names = ("Z9", "a_1", "0/3", "o4", "o5", "o6", "3/7")
    for _ in range(3):
        x = int(rng.integers(0, 2**31))
        got = run(port, "names", {"inp": np.uint32(x).tobytes()}, outputs={n: 4 for n in names}, workgroups=(1, 1, 1))
        want = {"Z9": 1, "a_1": 2, "r_sultat_": 3, "o4": 4, "o5": 5, "o6": 6, "o7": 7}
        assert {k: int(np.frombuffer(v, np.uint32)[0]) for k, v in got.items()} == {k: x + d for k, d in want.items()}
    with pytest.raises(PortError) as err:  # no empty reply: a kernel that writes nothing is refused
        port.call("run", b"reads_only", {b"inp": bytes(4)}, {"workgroups": (1, 1, 1)})
    assert err.value.reason == "bad_kernel" and "writes no buffer" in err.value.detail
    with pytest.raises(PortError) as err:
        run(port, "unicode", {"inp": bytes(4)}, outputs={n: 4 for n in names}, workgroups=(1, 1, 1))
    assert err.value.reason == "bad_kernel" and "ASCII" in err.value.detail


KERNELS["plus"] = """
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&out)) { out[i] = a[i] + 1u; }
}
"""


def test_a_chain_steps_constant_the_kernel_lacks_is_bad_args_not_internal(port):
    """BEFORE: a chain step naming an override its kernel does not declare
    reached the compile guard's admission, whose pipeline_constants raised
    KeyError: the caller got `internal` (dev_kem: a 500), not a refusal
    naming the constant. Now bad_args, and the same chain without it runs."""
    a = np.arange(8, dtype=np.uint32)
    step = {"kernel": b"plus", "buffers": {b"a": a.tobytes()}, "outputs": {b"out": 32}, "grid": (8, 1, 1)}
    for constants in ({b"nope": 1}, {b"nope": 1.5, b"other": 2}):
        with pytest.raises(PortError) as err:
            port.chain([{**step, "constants": constants}])
        assert err.value.reason == "bad_args" and "nope" in err.value.detail, err.value
    got = port.chain([step])
    assert np.array_equal(np.frombuffer(got["out"], np.uint32), a + 1)


# -- a batch of named calls (gpu_loop gathers those of one kernel) ------------------

from test_request_budgets import SPIN, spin_input  # noqa: E402

KERNELS["spin"] = SPIN


def test_a_batch_of_more_shapes_than_kits_answers_every_call_right(port):
    """Calls of one kernel queued behind a long call run as one batch
    (named_batch.py). 24 of them, each its own shape (output sizes 4..96
    bytes), are more shapes than the 16 kits kept: planning a later call
    must not release a kit an earlier call of the same batch holds. Every
    call is exactly a + 1 of its own random words."""
    rng = np.random.default_rng(29)
    run(port, "inc", {"a": bytes(4)}, outputs={"out": 4}, workgroups=(1, 1, 1))  # admitted
    opts = {"outputs": {b"output": 16 << 10}, "workgroups": (64, 1, 1)}
    run(port, "spin", {"input": spin_input(1, 1)}, outputs={"output": 16 << 10}, workgroups=(64, 1, 1))
    for _ in range(2):
        long = port.call_async("run", b"spin", {b"input": spin_input(4000, 3)}, opts)  # holds the GPU thread
        datas = [rng.integers(0, 2**32 - 1, k + 1, dtype=np.uint32) for k in range(24)]
        futures = [port.call_async("run", b"inc", {b"a": a.tobytes()}, {"outputs": {b"out": 4 * len(a)}, "workgroups": (1, 1, 1)})
                   for a in datas]
        long.result(120)
        for a, fut in zip(datas, futures):
            got = fut.result(120)
            assert np.array_equal(np.frombuffer(terms.binary_bytes(got[terms.Binary(b"out")]), np.uint32), a + 1)
    stats = {terms.atom_name(k): v for k, v in port.call("stats").items()}
    assert stats.get("named_batches", 0) >= 1, stats


def test_a_batch_mates_gpu_error_on_a_large_shape_leaves_the_others_kits_alone(port):
    """A call of a shape over KIT_BYTES in a batch runs alone; when wgpu
    refuses it (16 bytes for uni_const's 1 KiB uniform) its kernel's kits
    are dropped. Calls of the same kernel taken into the batch before it
    must still be answered with their own words, not gpu_error."""
    rng = np.random.default_rng(31)
    big = (4 << 20) + 1024  # output bytes: the shape is over KIT_BYTES
    run(port, "uni_const", {"u": bytes(1024)}, outputs={"out": 1024}, workgroups=(1, 1, 1))  # admitted
    opts = {"outputs": {b"output": 16 << 10}, "workgroups": (64, 1, 1)}
    for _ in range(2):
        long = port.call_async("run", b"spin", {b"input": spin_input(4000, 5)}, opts)
        datas = [rng.integers(0, 2**32 - 1, 256, dtype=np.uint32) for _ in range(3)]
        good = [port.call_async("run", b"uni_const", {b"u": d.tobytes()}, {"outputs": {b"out": 1024}, "workgroups": (1, 1, 1)})
                for d in datas[:2]]
        bad = port.call_async("run", b"uni_const", {b"u": bytes(16)}, {"outputs": {b"out": big}, "workgroups": (1, 1, 1)})
        good.append(port.call_async("run", b"uni_const", {b"u": datas[2].tobytes()},
                                    {"outputs": {b"out": 1024}, "workgroups": (1, 1, 1)}))
        long.result(120)
        with pytest.raises(PortError) as err:
            bad.result(120)
        assert err.value.reason == "gpu_error", err.value
        for d, fut in zip(datas, good):
            got = fut.result(120)
            assert np.array_equal(np.frombuffer(terms.binary_bytes(got[terms.Binary(b"out")]), np.uint32), d)


def port_rss_mib(port) -> int:
    with open(f"/proc/{port.proc.pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) // 1024


def test_kept_plans_and_kits_hold_no_callers_bytes(port):
    """BEFORE: a kept plan (64 of them) and a kept kit (16) held its first
    call's Bound.data, the caller's bytes, though never read again: 64
    calls of ~3 MiB inputs, each its own signature, grew the port by ~250
    MiB on lavapipe (the 16 kits' own buffers are ~50 of that there, none
    on a GPU), and a caller's bytes stayed in the port after its call.
    Now ~60 MiB; each call still exactly a + 1."""
    rng = np.random.default_rng(41)
    run(port, "inc", {"a": bytes(4)}, outputs={"out": 4}, workgroups=(1, 1, 1))
    before = port_rss_mib(port)
    words = (3 << 20) // 4
    for i in range(64):
        a = rng.integers(0, 2**32 - 1, words - i, dtype=np.uint32)
        got = run(port, "inc", {"a": a.tobytes()}, outputs={"out": 4}, workgroups=(1, 1, 1))
        assert np.frombuffer(got["out"], np.uint32)[0] == a[0] + 1
    grown = port_rss_mib(port) - before
    assert grown < 150, f"the port grew {grown} MiB over 64 calls of 3 MiB"


KERNELS["ids"] = """
override A: f32 = 0.0;
@id(7) override BIAS: f32 = 0.5;
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() { out[0] = bitcast<u32>(A); out[1] = bitcast<u32>(BIAS); }
"""


def test_one_override_given_twice_is_refused_not_one_value_picked(port):
    """BEFORE: #{'A' => 1.0, <<"A">> => 2.0} (two keys in Erlang) kept the
    last of the two, and #{<<"7">> => 1.0, <<"BIAS">> => 2.0} (BIAS is
    @id(7)) ran with one of them: no word said which. Now bad_args naming
    it, on run and in a chain step; each alone runs with its value."""
    f = lambda x: int(np.float32(x).view(np.uint32))  # noqa: E731
    for constants in ({terms.atom("A"): 1.0, b"A": 2.0}, {b"7": 1.0, b"BIAS": 2.0}, {terms.atom("BIAS"): 1.0, b"7": 2.0}):
        with pytest.raises(PortError) as err:
            port.call("run", b"ids", {}, {"outputs": {b"out": 8}, "workgroups": (1, 1, 1), "constants": constants})
        assert err.value.reason == "bad_args" and "twice" in err.value.detail, err.value
        with pytest.raises(PortError) as err:
            port.chain([{"kernel": b"ids", "outputs": {b"out": 8}, "workgroups": (1, 1, 1), "constants": constants}])
        assert err.value.reason == "bad_args" and "twice" in err.value.detail, err.value
    got = run(port, "ids", {}, outputs={"out": 8}, workgroups=(1, 1, 1), constants={"A": 1.0, "7": 2.0})
    assert words(got["out"]) == [f(1.0), f(2.0)]


# -- "$" matched before a trailing newline -------------------------------------------

def test_a_buffer_name_with_a_trailing_newline_is_refused(port):
    """BEFORE: sessions.NAME ended in "$", which also matches before a final
    newline: a chain's `outputs` and `bind` took "c2\\n", and its result came
    back under that name (dev_kem put it in a multipart part's name, a
    header line: kem_red_team3_tests). Now bad_args, as "c 2" is."""
    a = np.arange(4, dtype=np.uint32)
    step = {"kernel": b"plus", "buffers": {b"a": a.tobytes()}, "grid": (4, 1, 1)}
    assert np.array_equal(np.frombuffer(port.chain([{**step, "outputs": {b"c2": 16}, "bind": {b"out": b"c2"}}])["c2"], np.uint32), a + 1)
    for name in (b"c2\n", b"c2\r\n", b"c 2"):
        with pytest.raises(PortError) as err:
            port.chain([{**step, "outputs": {name: 16}, "bind": {b"out": name}}])
        assert err.value.reason == "bad_args", err.value


def test_warm_takes_whole_kernel_ids_only(tmp_path):
    """BEFORE: warm read its shapes with KERNEL_ID.match, a prefix match:
    "sub/../../outside/evil" passed (its first three letters), and the
    kernel store, which relies on ids of [A-Za-z0-9_-] only, read and
    compiled outside/evil.wgsl, outside the kernel directory. Warm's shapes
    come from the node, which sends only ids it served; now fullmatch."""
    kernels, outside = tmp_path / "kernels", tmp_path / "outside"
    (kernels / "sub").mkdir(parents=True)
    outside.mkdir()
    (kernels / "inc.wgsl").write_text(KERNELS["inc"])
    (outside / "evil.wgsl").write_text(KERNELS["inc"])
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(tmp_path / "cache")) as p:
        for kid, entry in ((b"sub/../../outside/evil", b"main"), (b"inc", b"main\n"), (b"inc\n", b"main")):
            with pytest.raises(PortError) as err:
                p.call("warm", [(kid, entry, False)])
            assert err.value.reason == "bad_args", err.value
        counts = {terms.atom_name(k): v for k, v in p.call("warm", [(b"inc", b"main", False)]).items()}
        assert counts["compiled"] == 1


def test_a_batch_of_one_shape_on_replicas_sees_only_its_own_bytes(port):
    """Held: 12 calls of `reveal` queued together, lengths 21..24 (one
    padded shape: the kit and its replicas), random bytes each, then the
    same again: every call reads its own bytes and zeros where its binding
    is padded, never a batch-mate's or the previous batch's."""
    rng = np.random.default_rng(43)
    opts_spin = {"outputs": {b"output": 16 << 10}, "workgroups": (64, 1, 1)}
    run(port, "reveal", {"a": b"\1" * 24, "io": b"\2" * 24}, outputs={"seen": 128, "partial": 4}, workgroups=(1, 1, 1))
    batches = lambda: {terms.atom_name(k): v for k, v in port.call("stats").items()}.get("named_batches", 0)  # noqa: E731
    before = batches()
    for _ in range(2):
        long = port.call_async("run", b"spin", {b"input": spin_input(4000, 9)}, opts_spin)
        calls = [(rng.integers(0, 256, int(rng.integers(21, 25)), dtype=np.uint8).tobytes(),
                  rng.integers(0, 256, int(rng.integers(21, 25)), dtype=np.uint8).tobytes()) for _ in range(12)]
        futures = [port.call_async("run", b"reveal", {b"a": a, b"io": io}, {"outputs": {b"seen": 128, b"partial": 4},
                                                                          "workgroups": (1, 1, 1)}) for a, io in calls]
        long.result(120)
        for (a, io), fut in zip(calls, futures):
            got = {terms.binary_bytes(k).decode(): terms.binary_bytes(v) for k, v in fut.result(120).items()}
            assert got == reveal_expected(a, io, 4)
    assert batches() >= before + 2
