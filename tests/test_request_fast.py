"""The narrow request decoder (kem_port/request_fast.py) gives exactly what
erlang-py gives for kem's hot shapes, and never accepts what erlang-py
would refuse: truncated frames and trailing bytes fall through to it."""

from __future__ import annotations

import erlang
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kem_port.wire import terms
from kem_port.errors import KemError
from kem_port.wire.request_fast import decode_hot

atoms = st.sampled_from(["call", "execute_kernel", "execute_kernel_with_params", "ping", "true", "false", "undefined", "ok"])
integers = st.one_of(st.integers(0, 255), st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**64 - 1), st.integers(-(2**64) + 1, 0))
binaries = st.binary(max_size=300)
leaves = st.one_of(atoms.map(terms.atom), integers, binaries.map(terms.Binary))
hot_terms = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=12)


def request(req_id: int, method: str, args: tuple) -> bytes:
    return erlang.term_to_binary((terms.atom("call"), req_id, terms.atom(method), args))


def same(a, b) -> bool:
    return erlang.term_to_binary(a) == erlang.term_to_binary(b)


@settings(max_examples=300, deadline=None)
@given(term=hot_terms)
def test_hot_terms_decode_as_erlang_py_decodes_them(term):
    frame = erlang.term_to_binary(term)
    fast = decode_hot(frame)
    if fast is None:  # allowed: erlang-py decodes it (e.g. nesting past the hot depth)
        return
    assert same(fast, erlang.binary_to_term(frame))


@settings(max_examples=200, deadline=None)
@given(req_id=st.integers(0, 2**64 - 1), kernel=st.binary(min_size=1, max_size=40), data=binaries, hint=st.integers(1, 2**31 - 1))
def test_kernel_requests_take_the_fast_path(req_id, kernel, data, hint):
    frame = request(req_id, "execute_kernel", (terms.Binary(kernel), terms.Binary(data), hint))
    fast = decode_hot(frame)
    assert fast is not None
    assert same(fast, erlang.binary_to_term(frame))
    assert fast[1] == req_id and terms.binary_bytes(fast[3][1]) == data


def test_node_encoded_atoms_decode_as_erlang_py_does():
    # OTP 25 sends latin-1 atoms as ATOM_EXT (100), later OTPs as SMALL_ATOM_UTF8_EXT (119).
    for frame in (
        b"\x83h\x04d\x00\x04calla\x07d\x00\x04pingh\x00",
        b"\x83h\x04w\x04calla\x07w\x04pingh\x00",
        b"\x83h\x04s\x04calla\x07v\x00\x04pingh\x00",
        b"\x83h\x02w\x04truew\x09undefined",
    ):
        assert same(decode_hot(frame), erlang.binary_to_term(frame)), frame


def test_truncated_or_padded_frames_are_left_to_erlang_py_which_refuses_them():
    frame = request(7, "execute_kernel", (terms.Binary(b"double"), terms.Binary(bytes(100)), 1))
    for cut in range(len(frame)):
        assert decode_hot(frame[:cut]) is None
        with pytest.raises(KemError):
            terms.decode(frame[:cut])
    for junk in (b"\x00", b"junk", frame):
        assert decode_hot(frame + junk) is None
        with pytest.raises(KemError):
            terms.decode(frame + junk)


def test_small_maps_are_read_here_as_erlang_py_reads_them():
    """The run method's buffers and options (and execute's options)."""
    opts = {terms.atom("output_size"): 8, terms.atom("grid"): (4, 1, 1), terms.Binary(b"x"): terms.Binary(b"\x01" * 5), 7: True}
    frame = request(3, "execute", (terms.Binary(b"k"), terms.Binary(b"abcd"), opts))
    assert same(decode_hot(frame), erlang.binary_to_term(frame))
    assert decode_hot(frame)[3][2] == opts


def test_proper_lists_are_read_here_as_erlang_py_reads_them():
    """A chain's steps: a list of maps."""
    steps = [{terms.atom("kernel"): terms.Binary(b"double")}, {terms.atom("workgroups"): (1, 2, 3)}, []]
    frame = request(4, "chain", (steps, {terms.atom("input"): terms.Binary(b"abcd")}))
    assert decode_hot(frame) is not None and same(decode_hot(frame), erlang.binary_to_term(frame))


def test_other_shapes_fall_through_to_erlang_py():
    for opts in ({terms.atom("constants"): {terms.Binary(b"k"): 1.5}},  # a float
                 {(1, 2): 3},  # a tuple key: erlang-py rebuilds it
                 {terms.atom("list"): erlang.OtpErlangList([1, 2], improper=True)}):  # an improper list
        frame = request(3, "execute", (terms.Binary(b"k"), terms.Binary(b"abcd"), opts))
        assert decode_hot(frame) is None
        assert same(terms.decode(frame), erlang.binary_to_term(frame))
    string = b"\x83k\x00\x03abc"  # STRING_EXT: erlang-py's bytes
    assert decode_hot(string) is None and same(terms.decode(string), erlang.binary_to_term(string))
    deep = erlang.term_to_binary(((((((((1,),),),),),),),))  # past the walk's depth of 6
    assert decode_hot(deep) is None and same(terms.decode(deep), erlang.binary_to_term(deep))
    assert decode_hot(b"\x83P\x00\x00\x00\x10x\x9c") is None  # compressed: refused by terms.decode
    with pytest.raises(KemError):
        terms.decode(b"\x83P\x00\x00\x00\x10x\x9c")


def test_a_chains_repeated_steps_are_read_once_and_as_each_alone():
    """session_protocol.chain_steps reads a repeated step map once; a value
    that Python calls equal but Erlang does not (true and 1) is not taken
    for the other, and a bad repeat names its own index."""
    from kem_port.config import Config
    from kem_port.gpu.session.chain_steps import StepError
    from kem_port.wire import session_protocol as sp

    config = Config()
    kernel = {terms.atom("kernel"): terms.Binary(b"double")}
    sized = {**kernel, terms.atom("output_size"): 1}
    frame = request(1, "chain", ([kernel, sized, kernel, sized], {}))
    steps = sp.chain_steps(decode_hot(frame)[3][0], config)
    assert [s.output_size for s in steps] == [None, 1, None, 1]
    assert steps == sp.chain_steps(erlang.binary_to_term(frame)[3][0], config)  # erlang-py's terms read alike
    bad = {**kernel, terms.atom("output_size"): True}
    with pytest.raises(StepError) as err:
        sp.chain_steps(decode_hot(request(1, "chain", ([sized, bad], {})))[3][0], config)
    assert err.value.step == 1 and "output_size" in err.value.detail


def test_repeated_steps_are_told_apart_by_their_binaries_bytes():
    """Steps are keyed by a binary's bytes (not erlang-py's object): steps
    naming different kernels, or buffers, stay apart; equal bytes in
    distinct objects, and binary map keys, are one step."""
    from kem_port.config import Config
    from kem_port.gpu.session.chain_steps import StepError
    from kem_port.wire import session_protocol as sp

    config = Config()
    step = lambda kernel, out: {terms.atom("kernel"): terms.Binary(kernel), terms.atom("output"): terms.Binary(out)}  # noqa: E731
    value = [step(b"double", b"a"), step(b"double", b"b"), step(b"triple", b"a"), step(b"double", b"a")]
    steps = sp.chain_steps(value, config)
    assert [(s.kernel_id, s.output) for s in steps] == [("double", "a"), ("double", "b"), ("triple", "a"), ("double", "a")]
    assert steps[0] is steps[3]  # read once
    assert sp._same_as(step(b"double", b"a")) == sp._same_as(step(b"double", b"a"))
    assert sp._same_as(step(b"double", b"a")) != sp._same_as({terms.atom("kernel"): terms.Binary(b"double", 7),
                                                               terms.atom("output"): terms.Binary(b"a")})
    binary_keys = {terms.Binary(b"kernel"): terms.Binary(b"double")}
    assert sp._same_as(binary_keys) != sp._same_as(step(b"double", b"a"))
    for _ in range(2):  # refused whole each time, from the cache too
        with pytest.raises(StepError) as err:
            sp.chain_steps([binary_keys, binary_keys], config)
        assert err.value.step == 0 and err.value.detail == "step key 'kernel' is a binary; keys are atoms: kernel => ..."
