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
  caller), and the narrow decoder leaves such a map to it.

Held (regression tests): see each test's docstring.
"""

from __future__ import annotations

import struct

import erlang
import numpy as np
import pytest

from conftest import start_port
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
    kernels = tmp_path_factory.mktemp("red_run3")
    for name, text in KERNELS.items():
        (kernels / f"{name}.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache")) as p:
        yield p


def run(port, kernel: str, buffers: dict, **opts) -> dict[str, bytes]:
    named = {k.encode() if isinstance(k, str) else k: v for k, v in buffers.items()}
    if "outputs" in opts:
        opts["outputs"] = {k.encode() if isinstance(k, str) else k: v for k, v in opts["outputs"].items()}
    got = port.call("run", kernel.encode(), named, opts)
    return {terms.binary_bytes(k).decode(): terms.binary_bytes(v) for k, v in got.items()}


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
