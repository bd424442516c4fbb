"""Red team 5: this session's changes attacked (wave 3, session 5).

* a chain's repeated steps keyed by value (session_protocol._same_as):
  two steps Erlang tells apart never share a key, from either decoder;
* terms.unknown_key: a key spelling a known option in the wrong type is
  told so, cheaply, whatever its size;
* Replies.ok splicing a binary result: every ReqId form the port takes,
  empty and > 64 KiB results, replies frames mixed with errors;
* gpu/kept.py: a session kernel's shape evicted while its pipeline stays.
"""

from __future__ import annotations

import random
import struct
import time

import erlang
import numpy as np
import pytest
from conftest import session_port, start_port

from kem_port.client import PortError
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.session.chain_steps import StepError
from kem_port.wire import session_protocol as sp
from kem_port.wire import terms
from kem_port.wire.etf_guard import check_frame
from kem_port.wire.narrow_decode import decode_hot

UNDEF = terms.atom("undefined")
A, B = terms.atom, terms.Binary


@pytest.fixture(scope="module")
def port():
    with session_port() as client:
        yield client


def _raw(port, method: str, *args, timeout: float = 30.0):
    """A call whose arguments are erlang-py terms as they are (the client's
    own encoding turns bytes into binaries and str keys into atoms)."""
    return port.call_raw(lambda req_id: erlang.term_to_binary((A("call"), req_id, A(method), args)), timeout)


# -- 1. repeated steps keyed by value -----------------------------------------

# Erlang terms that are all different to Erlang (by construction), several
# of which Python holds equal or spells alike: 1 == True == 1.0, an atom
# and a binary and a charlist of one text, a bitstring and its bytes.
_VALUES = [
    A("main"), A("double"), A("a"), A("kernel"), A("output"),
    B(b"main"), B(b"double"), B(b"a"), B(b"kernel"), B(b""), B(b"\x00"),
    B(b"double", 7), B(b"\x80", 1), B(b"\x81", 1), B(b"", 8),
    b"main", b"double", b"a",  # charlists (erlang-py sends bytes as a string)
    0, 1, -1, 255, 256, 2**31 - 1, 2**31, 2**63, 2**64 - 1, 2**64, -(2**64), 2**200,
    True, False, None, 1.0, 0.0, -0.0, 64.0,
    (1, 1, 1), [], [B(b"a")], {A("a"): 1},
]
_KEYS = [A("kernel"), A("output"), A("entry_point"), A("output_size"), A("input"),
         B(b"kernel"), B(b"output"), b"kernel", 1, 2**64, B(b"kernel", 7), A("true")]


def _decoded(term: dict) -> list:
    """The term as the port reads it: the narrow decoder's, and erlang-py's
    behind etf_guard's walk (which refuses a map keyed by both 1 and true,
    merged into one key by Python), as terms.decode_request reads a frame."""
    frame = erlang.term_to_binary(term)
    out = []
    hot = decode_hot(frame)
    if hot is not None:
        out.append(hot)
    try:
        check_frame(frame)
    except KemError:
        return out
    return out + [erlang.binary_to_term(frame)]


def test_steps_erlang_tells_apart_never_share_a_key_from_either_decoder():
    """4000 random step maps of 1..4 keys from a pool of terms Python
    confuses (true/1/1.0, 0.0/-0.0, atom/binary/charlist of one text,
    bitstrings, big ints, keys and values swapped), decoded by erlang-py
    and by the narrow decoder: whenever two get one key from _same_as,
    they are one Erlang map (the pool's atoms all spelled one way, so
    erlang-py's encoding is the term's identity)."""
    rng = random.Random()
    hashable = [v for v in _VALUES if not isinstance(v, (list, dict))]
    seen: dict[frozenset, frozenset] = {}
    keyed = 0
    for _ in range(4000):
        n = rng.randint(1, 4)
        if rng.random() < 0.2:  # swapped: values as keys, keys as values
            pairs = [(rng.choice(hashable), rng.choice(_KEYS)) for _ in range(n)]
        else:
            pairs = [(rng.choice(_KEYS), rng.choice(_VALUES)) for _ in range(n)]
        term = dict(pairs)
        if len(term) != n:  # a key twice, or two Python merges (1 and 1.0): not n pairs
            continue
        ident = frozenset((erlang.term_to_binary(k), erlang.term_to_binary(v)) for k, v in term.items())
        for decoded in _decoded(term):
            key = sp._same_as(decoded)
            if key is None:
                continue
            keyed += 1
            assert seen.setdefault(key, ident) == ident, (term, key)
    assert keyed > 1000  # the attack reached the cache's keys


@pytest.mark.parametrize("variant", [
    {A("kernel"): A("double")},                       # an atom where the binary was
    {A("kernel"): B(b"double", 7)},                   # a bitstring of the same bytes
    {A("kernel"): b"double"},                         # a charlist (STRING_EXT)
    {B(b"kernel"): B(b"double")},                     # the key a binary
    {A("kernel"): B(b"double"), A("output_size"): True},
    {A("kernel"): B(b"double"), A("output_size"): 64.0},
])
def test_a_step_like_a_good_one_is_refused_at_its_own_index_through_the_port(port, rng, variant):
    """[good, variant, good]: the variant differs from the good step only
    in a type; it is refused as step 2, on the narrow decoder's road (a
    ReqId as INTEGER_EXT) and on erlang-py's (the same frame, its ReqId as
    LARGE_BIG_EXT, which the narrow decoder leaves); the good chain runs."""
    good = {A("kernel"): B(b"double"), A("output_size"): 64}
    frame = erlang.term_to_binary((A("call"), 0, A("chain"), (UNDEF, [good, variant, good], {A("input"): B(bytes(64))})))
    for road in ("narrow", "erlang-py"):
        (req_id,) = port.next_req_ids(1)
        form = b"b" + req_id.to_bytes(4, "big") if road == "narrow" else b"o\x00\x00\x00\x04\x00" + req_id.to_bytes(4, "little")
        sent = _with_req_id(frame, form)
        if road == "erlang-py":
            assert decode_hot(sent) is None
        with pytest.raises(PortError) as err:
            port.call_raw_frame(sent, [req_id])[0].result(30)
        assert err.value.step == 2 and err.value.reason != "internal", err.value
    x = rng.integers(0, 2**32, 16, dtype=np.uint32)
    got = _raw(port, "chain", UNDEF, [good, good, good], {A("input"): B(x.tobytes())})
    assert np.array_equal(np.frombuffer(got, "<u4"), x * np.uint32(8))


# -- 2. a known option's name as a key of the wrong type -----------------------


def test_an_erlang_string_key_spelling_a_known_option_is_said_to_be_a_string():
    """#{"kernel" => ...} (an Erlang string, as "kernel" in double quotes
    is) was refused as "unknown step key 'kernel'; known: kernel, ...":
    the very confusion the binary's message removed."""
    config = Config()
    for key in (b"kernel", b"output"):
        with pytest.raises(StepError) as err:
            sp.chain_steps([{key: B(b"double")}], config)
        detail = err.value.detail
        assert detail.startswith(f"step key '{key.decode()}' is a string; keys are atoms"), detail
        assert "unknown" not in detail
    with pytest.raises(StepError) as err:  # a string that spells no option: unknown, as before
        sp.chain_steps([{b"kernels": B(b"double")}], config)
    assert err.value.detail.startswith("unknown step key 'kernels'; known: kernel,")


def test_an_erlang_string_key_through_the_port(port):
    frame_key = {b"kernel": B(b"double")}
    with pytest.raises(PortError) as err:
        _raw(port, "chain", UNDEF, [frame_key], {A("input"): B(bytes(16))})
    assert err.value.reason == "bad_args" and "is a string; keys are atoms: kernel => ..." in err.value.detail


@pytest.mark.parametrize("size, string", [(65, False), (1 << 20, False), (16 << 20, False), (65, True), (65535, True)])
def test_a_huge_key_spelling_a_known_option_is_refused_cheaply_and_shortly(port, size, string):
    """A binary (or Erlang string, at most 65535 bytes) key of `size` bytes
    starting with a known name: refused in well under a second, the
    reply's detail short and escaped."""
    key = (b"kernel" + b"\n\x00'" * ((size - 6) // 3 + 1))[:size]
    started = time.perf_counter()
    with pytest.raises(PortError) as err:
        _raw(port, "chain", UNDEF, [{key if string else B(key): B(b"double")}], {A("input"): B(bytes(16))})
    took = time.perf_counter() - started
    detail = err.value.detail
    assert err.value.reason in ("bad_args", "too_large", "bad_frame") and len(detail) < 400, detail  # etf_guard: strings to 4096
    assert "\x00" not in detail and "\n" not in detail and took < 2.0, (took, detail[:200])


# -- 3. a binary result spliced: every ReqId form, sizes, replies frames ------


def _req_id_forms(n: int) -> list[bytes]:
    """Every ETF spelling of the non-negative integer n the port takes."""
    forms = []
    if n < 256:
        forms.append(bytes([97, n]))
    if n < 2**31:
        forms.append(b"b" + n.to_bytes(4, "big"))
    for width in {max(1, (n.bit_length() + 7) // 8), 8}:
        if n < 256 ** width:
            digits = n.to_bytes(width, "little")
            forms.append(bytes([110, width, 0]) + digits)           # SMALL_BIG
            forms.append(b"o" + struct.pack(">I", width) + b"\x00" + digits)  # LARGE_BIG
    return forms


def _with_req_id(frame: bytes, form: bytes) -> bytes:
    """A request frame encoded with ReqId 0 (SMALL_INTEGER at byte 9),
    its ReqId spelled `form` instead."""
    head = bytes([131, 104]) + frame[2:3] + erlang.term_to_binary(A("call"))[1:]
    assert frame.startswith(head) and frame[len(head):len(head) + 2] == b"a\x00"
    return head + form + frame[len(head) + 2:]


@pytest.mark.parametrize("req_id", [0, 1, 255, 256, 2**31 - 1, 2**31, 2**32, 2**63, 2**64 - 1])
def test_binary_results_reach_every_req_id_form(port, rng, req_id):
    """hello, a session buffer's read (empty, small, > 64 KiB) and a chain
    answered to a ReqId written in each ETF form the port takes."""
    session = port.session_open()
    big = rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    session.create("big", big)
    x = rng.integers(0, 2**32, 32, dtype=np.uint32)
    asks = [
        ((A("hello"), ()), b"Hello world!"),
        ((A("buffer_read"), (session.ref, B(b"big"), 0, 0)), b""),
        ((A("buffer_read"), (session.ref, B(b"big"), 8, 1000)), big[8:1008]),
        ((A("buffer_read"), (session.ref, B(b"big"), 0, UNDEF)), big),
        ((A("chain"), (UNDEF, [{A("kernel"): B(b"double")}] * 3, {A("input"): B(x.tobytes())})), (x * np.uint32(8)).tobytes()),
    ]
    try:
        for (method, args), want in asks:
            frame = erlang.term_to_binary((A("call"), 0, method, args))
            for form in _req_id_forms(req_id):
                got = port.call_raw_frame(_with_req_id(frame, form), [req_id])[0].result(30)
                assert got == want, (method, form)
        # and in one calls frame (replies frames back): ReqIds near this one, each form in turn
        ids, frames, wants = [], [], []
        for j in range(40):
            near = req_id - j if req_id >= j else req_id + j
            (method, args), want = asks[j % len(asks)]
            forms = _req_id_forms(near)
            frames.append(_with_req_id(erlang.term_to_binary((A("call"), 0, method, args)), forms[j % len(forms)]))
            ids.append(near)
            wants.append(want)
        for want, fut in zip(wants, port.call_raw_batch(frames, ids)):
            assert fut.result(30) == want
        assert not port.unmatched
    finally:
        session.close()


def test_calls_frames_of_binary_results_and_errors_each_reach_their_caller(port, rng):
    """Calls frames (the node's) of chains, session reads of 0 B to 100 KB,
    hello and refusals, behind a busy GPU so chains gather: each caller
    gets its own bytes or its own error, whether its reply came alone or in
    a replies frame; big ReqIds (to 2^64 - 1) included."""
    session = port.session_open()
    big = rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    session.create("big", big)
    steps = [{A("kernel"): B(b"double")}] * 4
    for _ in range(2):  # the chain's shape planned, then kept: later ones may gather
        _raw(port, "chain", UNDEF, steps, {A("input"): B(bytes(128))})
    batches = port.call("stats").get(A("chain_batches"), 0)
    try:
        for round_ in range(3):
            frames, ids, want = [], [], []
            base = [5, 2**32 + 7, 2**63 + 11, 2**64 - 300][round_ % 4] if round_ else None
            for i in range(60):
                req_id = base + i if base is not None else port.next_req_ids(1)[0]
                kind = i % 6
                if kind in (0, 1):
                    x = rng.integers(0, 2**32, 32, dtype=np.uint32)  # one shape, so they gather
                    call, expect = (A("chain"), (UNDEF, steps, {A("input"): B(x.tobytes())})), (x * np.uint32(16)).tobytes()
                elif kind == 2:
                    off, n = 4 * int(rng.integers(0, 250)), int(rng.choice([0, 4, 8, 70_000, 99_000]))
                    call, expect = (A("buffer_read"), (session.ref, B(b"big"), off, n)), big[off:off + n]
                elif kind == 3:
                    call, expect = (A("hello"), ()), b"Hello world!"
                elif kind == 4:
                    call, expect = (A("chain"), (UNDEF, steps, {A("input"): B(bytes(12)), A("return"): [B(b"nope")]})), PortError
                else:
                    call, expect = (A("buffer_read"), (session.ref, B(b"missing"), 0, 4)), PortError
                frames.append(erlang.term_to_binary((A("call"), req_id, *call, 30_000)))
                ids.append(req_id)
                want.append(expect)
            busy = port.call_async("test_hook", A("sleep_gpu"), 300)
            pending = port.call_raw_batch(frames, ids)
            busy.result(30)
            for expect, fut in zip(want, pending):
                if expect is PortError:
                    with pytest.raises(PortError) as err:
                        fut.result(60)
                    assert err.value.reason != "internal"
                else:
                    assert fut.result(60) == expect
        assert not port.unmatched
        assert port.call("stats").get(A("chain_batches"), 0) > batches  # chains were gathered: a replies frame
    finally:
        session.close()


# -- 4. kernel shapes evicted while their pipelines stay ----------------------

_PARAMS_KERNEL = """
struct P {{ scale: u32, add: u32 }}
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(2) var<uniform> params: P;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    if (gid.x < arrayLength(&output_words)) {{ output_words[gid.x] = input_words[gid.x] * params.scale + params.add + {n}u; }}
}}
"""


def test_a_session_kernels_shape_evicted_while_its_pipeline_stays_still_checks_params(monkeypatch, request):
    """The shapes' bound (kept.SHAPES, 4 here for speed) passed by other
    kernels while the params kernel's pipeline stays cached (128 of
    those): its next call with short params is still refused by its shape,
    made again, and one with whole params gets the very pipeline kept, no
    compile; the shapes stay bounded."""
    from kem_port.gpu.device import Device
    from kem_port.gpu.session import session_pipelines as sp_mod
    from kem_port.kernel_store import source_from_bytes
    from kem_port.stats import Stats

    monkeypatch.setattr(sp_mod, "SHAPES", 4)
    stats = Stats()
    device = Device(Config(), stats)
    device.open()
    gpu = device.require()
    pipes = sp_mod.SessionPipelines(stats)
    request.addfinalizer(device.close)
    sources = [source_from_bytes(f"p{n}", _PARAMS_KERNEL.format(n=n).encode(), "test", "local") for n in range(12)]
    kept_one = pipes.get(gpu, sources[0], "main", bytes(8))
    for rounds in range(2):
        for other in sources[1:]:  # eight more shapes than the bound: p0's goes
            pipes.get(gpu, other, "main", bytes(8))
        assert sources[0].sha256 not in pipes._shapes and len(pipes._shapes) <= 4
        compiles = stats.snapshot().get("compiles", 0)
        with pytest.raises(KemError) as err:
            pipes.get(gpu, sources[0], "main", bytes(4))
        assert err.value.reason == "bad_args" and "8 bytes" in err.value.detail
        assert pipes.get(gpu, sources[0], "main", bytes(8)) is kept_one
        assert stats.snapshot().get("compiles", 0) == compiles
    assert len(pipes._shapes) <= 4


def test_gathered_chains_past_a_replies_frames_bytes_each_get_their_own(port, rng):
    """80 chains of 16 KiB results gathered (1.3 MB: past a replies frame's
    1 MiB, so split between results), sent in calls frames behind a busy
    GPU: every caller gets its own values."""
    steps = [{A("kernel"): B(b"double")}] * 2
    n = 4096
    for _ in range(2):
        _raw(port, "chain", UNDEF, steps, {A("input"): B(bytes(4 * n))})
    batches = port.call("stats").get(A("chain_batches"), 0)
    xs = [rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(80)]
    ids = port.next_req_ids(len(xs))
    frames = [erlang.term_to_binary((A("call"), i, A("chain"), (UNDEF, steps, {A("input"): B(x.tobytes())}), 30_000))
              for i, x in zip(ids, xs)]
    busy = port.call_async("test_hook", A("sleep_gpu"), 400)
    pending = [f for k in range(0, 80, 40) for f in port.call_raw_batch(frames[k:k + 40], ids[k:k + 40])]  # frames under 2 MiB
    busy.result(30)
    for x, fut in zip(xs, pending):
        assert np.array_equal(np.frombuffer(fut.result(60), "<u4"), x * np.uint32(4))
    assert port.call("stats").get(A("chain_batches"), 0) > batches


def test_a_plain_kernels_shape_evicted_while_its_pipeline_stays_still_checks_params(monkeypatch, request):
    """The same for kem@1.0's Pipelines (its shapes' bound 4 here, its
    pipelines' 256): short params refused after the eviction, whole ones
    served by the pipeline kept."""
    from kem_port.gpu import pipelines as pl_mod
    from kem_port.gpu.calls import KernelCall
    from kem_port.gpu.device import Device
    from kem_port.kernel_store import source_from_bytes
    from kem_port.stats import Stats

    monkeypatch.setattr(pl_mod, "SHAPES", 4)
    stats = Stats()
    device = Device(Config(), stats)
    device.open()
    request.addfinalizer(device.close)
    gpu, pipes = device.require(), pl_mod.Pipelines(stats)
    sources = [source_from_bytes(f"q{n}", _PARAMS_KERNEL.format(n=n).encode(), "test", "local") for n in range(12)]
    call = lambda s, params: KernelCall(s.kernel_id, bytes(16), 16, params)  # noqa: E731
    kept_one = pipes.get(gpu, sources[0], call(sources[0], bytes(8)))
    for other in sources[1:]:
        pipes.get(gpu, other, call(other, bytes(8)))
    assert sources[0].sha256 not in pipes._shapes and len(pipes._shapes) <= 4
    with pytest.raises(KemError) as err:
        pipes.get(gpu, sources[0], call(sources[0], bytes(4)))
    assert err.value.reason == "bad_args" and "8 bytes" in err.value.detail
    assert pipes.get(gpu, sources[0], call(sources[0], bytes(8))) is kept_one


# -- 5. named calls admitted on fetch threads, failing before and after their run


_AXPY = """// copy {n}
struct Params {{ alpha: f32, count: u32 }}
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x;
    if (i < params.count) {{ y[i] = params.alpha * x[i] + y[i]; }}
}}
"""


def test_named_calls_admitted_on_fetch_threads_give_every_share_back(tmp_path, rng):
    """24 fresh kernels, each first met by four calls at once (so each is
    admitted on a fetch thread, then queued without the reader's poll):
    a good call, one with an unknown constant (refused before its share),
    one missing a buffer (refused after it) and one past the port's byte
    budget (512 KiB here; refused at take). Values right, no internal, every share back."""
    for n in range(24):
        (tmp_path / f"axpy_{n}.wgsl").write_text(_AXPY.format(n=n))
    env = {"KEM_KERNEL_DIR": str(tmp_path), "KEM_CACHE_DIR": str(tmp_path / "cache"), "KEM_QUEUE_BYTES": str(512 << 10)}
    with start_port(**env) as port:
        checks, reasons = [], []
        for n in range(24):
            kernel = f"axpy_{n}".encode()
            count = int(rng.choice([1, 64, 1000]))
            alpha = np.float32(rng.standard_normal())
            x, y = rng.standard_normal(count).astype(np.float32), rng.standard_normal(count).astype(np.float32)
            params = np.array([alpha], np.float32).tobytes() + np.array([count], np.uint32).tobytes()
            buffers = {b"params": params, b"x": x.tobytes(), b"y": y.tobytes()}
            grid = {"grid": (count, 1, 1)}
            checks.append(((x, y, alpha), port.call_async("run", kernel, buffers, grid)))
            checks.append((None, port.call_async("run", kernel, buffers, {**grid, "constants": {"nope": 1}})))
            checks.append((None, port.call_async("run", kernel, {b"params": params, b"y": y.tobytes()}, grid)))
            checks.append((None, port.call_async("run", kernel, {**buffers, b"x": bytes(1 << 20)}, grid)))
        for want, fut in checks:
            if want is None:
                with pytest.raises(PortError) as err:
                    fut.result(120)
                assert err.value.reason != "internal", err.value
                reasons.append(err.value.reason)
                continue
            x, y, alpha = want
            got = fut.result(120)[terms.Binary(b"y")]
            np.testing.assert_allclose(np.frombuffer(terms.binary_bytes(got), np.float32), alpha * x + y, rtol=1e-6, atol=1e-6)
        stats = port.call_plain("stats")
        assert (stats["held_calls"], stats["held_bytes"]) == (0, 0)
        assert reasons.count("overloaded") == 24, reasons


# -- 6. a kernel's own names in refusals: bounded -------------------------------


def _many(kind: str, n: int) -> str:
    """A kernel (y = x + 1) declaring n overrides (with or without a default) or n extra entry points."""
    decls = {"defaults": "override o{i}: u32 = {i}u;\n", "no_defaults": "override m{i}: u32;\n",
             "entries": "@compute @workgroup_size(1) fn e{i}() {{}}\n"}[kind]
    return ("".join(decls.format(i=i) for i in range(n)) + "@group(0) @binding(0) var<storage, read> x: array<u32>;\n"
            "@group(0) @binding(1) var<storage, read_write> y: array<u32>;\n"
            "@compute @workgroup_size(1) fn main() { y[0] = x[0] + 1u; }\n")


@pytest.mark.parametrize("kind, opts", [
    ("defaults", {"output_size": 4, "constants": {"nope": 1}}),  # names the overrides it has
    ("no_defaults", {"output_size": 4, "constants": {"m0": 1}}),  # names those without a default
    ("entries", {"output_size": 4, "entry_point": "nope"}),  # names the entry points
])
def test_a_refusal_naming_a_kernels_declarations_stays_short(tmp_path, kind, opts):
    """A kernel (anyone's) may declare thousands of overrides or entry
    points within admission's 200k syntax nodes (15k overrides admitted):
    a refusal listing them all was 109 KB. Listed to 16, then counted."""
    (tmp_path / "many.wgsl").write_text(_many(kind, 2000))
    with start_port(KEM_KERNEL_DIR=str(tmp_path), KEM_CACHE_DIR=str(tmp_path / "cache")) as port:
        with pytest.raises(PortError) as err:
            port.call("execute", b"many", (41).to_bytes(4, "little"), opts, timeout=60)
        assert err.value.reason in ("bad_args", "bad_kernel") and len(err.value.detail) < 400, err.value.detail[:300]
        assert "more" in err.value.detail
        if kind == "defaults":  # the kernel itself is fine
            assert port.call("execute", b"many", (41).to_bytes(4, "little"), {"output_size": 4}) == (42).to_bytes(4, "little")
