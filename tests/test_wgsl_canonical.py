"""The canonical text of a kernel (gpu/wgsl_canonical.py, issue 24): the
WGSL spec's line breaks, blankspace and comments, one test each; what is
refused, with line:column; idempotence and "compiles exactly when the
original compiles" as properties over generated kernels, compiled by real
wgpu (lavapipe here); and the text kem's stores, rewrites and port hold."""

from __future__ import annotations

import pathlib
import timeit

import numpy as np
import pytest
import wgpu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import start_port
from kem_port.admission.zeroing import zero_workgroup_memory
from kem_port.client import PortError
from kem_port.errors import KemError
from kem_port.gpu.group.slot_kernel import rewrite
from kem_port.gpu.wgsl.wgsl_canonical import canonical, identifier_count, position, sequence_count, tokens
from kem_port.kernel_store import DirectoryStore, source_from_bytes

LINE_BREAKS = {"LF": "\n", "VT": "\v", "FF": "\f", "CR": "\r", "NEL": "\u0085", "LS": "\u2028", "PS": "\u2029"}
OTHER_BLANKS = {"TAB": "\t", "SPACE": " ", "LRM": "\u200e", "RLM": "\u200f"}
NOT_BLANK = {"NBSP": "\u00a0", "ZWSP": "\u200b", "BOM": "\ufeff", "EM_SPACE": "\u2003", "OGHAM": "\u1680"}
KERNELS = pathlib.Path(__file__).resolve().parents[1] / "kem_port" / "kernels"


def values(text: str) -> list[str]:
    return [value for _, value, _ in tokens(text)]


@pytest.mark.parametrize("name", sorted(LINE_BREAKS))
def test_every_line_break_ends_a_line_comment_and_a_line(name):
    text = f"a // hidden b{LINE_BREAKS[name]}c"
    assert values(text) == ["a", "c"]
    assert canonical(text) == "a" + " " * 12 + "\nc"
    assert position(text, len(text) - 1) == (2, 1)


def test_cr_lf_is_one_line_break():
    text = "a // x\r\nb\r\n\r\nc"
    assert canonical(text) == "a     " + " \nb \n \nc"
    assert position(text, len(text) - 1) == (4, 1)
    assert values(text) == ["a", "b", "c"]


@pytest.mark.parametrize("name", sorted(LINE_BREAKS) + sorted(OTHER_BLANKS))
def test_every_blankspace_code_point_separates_tokens(name):
    char = {**LINE_BREAKS, **OTHER_BLANKS}[name]
    text = f"var<{char}workgroup{char}>{char}x"
    assert values(text) == ["var", "<", "workgroup", ">", "x"]
    assert canonical(text) == text.replace(char, "\n" if name in LINE_BREAKS else " ")
    assert sequence_count(text, ("var", "<", "workgroup")) == 1


@pytest.mark.parametrize("name", sorted(OTHER_BLANKS))
def test_other_blankspace_does_not_end_a_line_comment(name):
    assert values(f"a // b{OTHER_BLANKS[name]}c\nd") == ["a", "d"]


@pytest.mark.parametrize("name", sorted(NOT_BLANK))
def test_unicode_spaces_the_spec_does_not_list_are_refused(name):
    with pytest.raises(KemError) as err:
        canonical(f"let x{NOT_BLANK[name]}= 1;")
    assert err.value.reason == "bad_kernel" and f"1:6: U+{ord(NOT_BLANK[name]):04X}" in err.value.detail
    assert canonical(f"// {NOT_BLANK[name]} is fine in a comment\nx") == " " * 25 + "\nx"


def test_block_comments_nest_and_keep_their_lines():
    assert values("a /* x /* y */ z */ b") == ["a", "b"]
    assert values("a /*/ x */ b") == ["a", "b"]  # '/*/' opens; it does not close
    assert values("a /**/ b /* // */ c") == ["a", "b", "c"]
    text = "a /* 1\r\n2\u2028 /* 3\f */ 4 */ b"
    assert canonical(text) == "a      \n \n     \n         b"
    assert position(text, len(text) - 1) == (4, 10)


@pytest.mark.parametrize("text,where,what", [
    ("fn f() {}\nfn g\u00e9() {}", "2:5", "U+00E9"),
    ("let a = 1;\n  let b\x00 = 2;", "2:8", "U+0000"),
    ("let a = $b;", "1:9", "U+0024 '$'"),
    ("// ok\u2028let s = \"x\";", "2:9", "U+0022"),
    ("let a = 1; /* open /* nested */ still open", "1:12", "never closed"),
    ("x\r\n? y", "2:1", "U+003F '?'"),
])
def test_what_the_lexer_cannot_account_for_is_refused_with_line_and_column(text, where, what):
    with pytest.raises(KemError) as err:
        canonical(text)
    assert err.value.reason == "bad_kernel" and err.value.detail.startswith(where + ":") and what in err.value.detail
    assert err.value.detail.isascii() and "\n" not in err.value.detail


def test_tokens_follow_the_spec():
    text = "a<<=b->c&&d; x = 0x1Fu + 1.5e-3f + .5h + 7i + 0x1.8p2 + 2e3; v.x"
    assert values(text) == ["a", "<<=", "b", "->", "c", "&&", "d", ";", "x", "=", "0x1Fu", "+", "1.5e-3f", "+", ".5h",
                            "+", "7i", "+", "0x1.8p2", "+", "2e3", ";", "v", ".", "x"]
    assert identifier_count("words[i] + words_in[i] + words", "words") == 2
    assert identifier_count("0xface + face1 + 1e5", "face") == 0


def test_kems_own_kernels_are_canonical_already():
    for path in KERNELS.glob("*.wgsl"):
        text = path.read_text()
        assert len(canonical(text)) == len(text) and canonical(canonical(text)) == canonical(text)


# -- properties ---------------------------------------------------------

BASE = """@group(0) @binding(0) var<storage, read> xs: array<u32>;
@group(0) @binding(1) var<storage, read_write> ys: array<u32>;
var<workgroup> part: array<u32, 64>;
fn scale(v: u32) -> u32 { return (v << 2u) / 3u + 0x1Fu; }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    part[li] = select(0u, xs[gid.x], gid.x < arrayLength(&xs));
    workgroupBarrier();
    var f = 1.5e-3f * f32(li) - .5;
    if (gid.x < arrayLength(&ys) && f > -1.0) { ys[gid.x] = scale(part[63u - li]) ^ u32(f); }
}
"""
BASE_VALUES = values(BASE)
# Broken twins: a missing ';', an unknown name, a '(' too many.
BROKEN = [BASE.replace("workgroupBarrier();", "workgroupBarrier()"), BASE.replace("scale(part", "scal(part"),
          BASE.replace("var f =", "var f = (")]
ALL_BLANKS = list(LINE_BREAKS.values()) + list(OTHER_BLANKS.values())
# No NUL: wgpu-native reads the WGSL as a C string, so the ORIGINAL would
# end there (test_a_nul_in_a_comment_no_longer_cuts_the_kernel_short).
comment_text = st.text(st.characters(blacklist_characters="".join(LINE_BREAKS.values()) + "*/\x00", blacklist_categories=("Cs",)), max_size=6)
line_comment = st.builds(lambda t, b: "//" + t + b, comment_text, st.sampled_from(list(LINE_BREAKS.values()) + ["\r\n"]))
block_comment = st.recursive(comment_text.map(lambda t: f"/*{t}*/"),
                             lambda inner: st.builds(lambda a, i, b: f"/*{a}{i}{b}*/", comment_text, inner, comment_text), max_leaves=3)
# Blank before and after: a comment next to a '/' token would start at it.
separator = st.lists(st.one_of(st.sampled_from(ALL_BLANKS), line_comment, block_comment), max_size=3).map(lambda ps: " " + "".join(ps) + " ")


def dressed(data, text: str) -> str:
    """text's tokens with random blankspace and comments between them."""
    parts = values(text)
    return "".join(p + data.draw(separator) for p in parts)


@pytest.fixture(scope="module")
def device() -> wgpu.GPUDevice:
    from kem_port.admission.probe import open_device

    return open_device(None)[1]


def compiles(device, code: str) -> bool:
    try:
        device.create_shader_module(code=code)
        return True
    except Exception:
        return False


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), base=st.sampled_from([BASE] + BROKEN))
def test_canonical_text_compiles_exactly_when_the_original_does(device, data, base):
    text = dressed(data, base)
    code = canonical(text)
    assert canonical(code) == code and len(code) == len(text) and code.isascii()
    assert values(code) == values(base)
    assert code.count("\n") == position(text, len(text))[0] - 1  # lines stay lines
    assert compiles(device, code) == compiles(device, text) == (base == BASE)


def test_a_nul_in_a_comment_no_longer_cuts_the_kernel_short(device):
    text = BASE.replace("workgroupBarrier();", "workgroupBarrier(); // \x00\n")
    assert not compiles(device, text)  # naga saw the text up to the NUL only
    assert compiles(device, canonical(text))


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(ALL_BLANKS + list(NOT_BLANK.values()) + list("ab1._/*<>;$\x00\u00e9\r\n")), max_size=40))
def test_canonical_is_idempotent_ascii_and_keeps_positions_or_refuses(text):
    try:
        code = canonical(text)
    except KemError as err:
        assert err.reason == "bad_kernel" and err.detail.isascii()
        return
    assert canonical(code) == code and len(code) == len(text) and code.isascii()
    assert set(code) <= set("ab1._/*<>; \n")


# -- where the canonical text is used -----------------------------------


def test_the_store_keeps_the_canonical_text_and_the_published_hash(tmp_path):
    data = "// a comment\u2028fn f() {}\r\n".encode()
    source = source_from_bytes("k", data, "here", "local")
    assert source.text == " " * 12 + "\nfn f() {} \n"
    import hashlib

    assert source.sha256 == hashlib.sha256(data).hexdigest()
    (tmp_path / "bad.wgsl").write_bytes(b"fn f() {}\nlet \xc3\xa9 = 1;")
    store = DirectoryStore(tmp_path)
    for _ in range(2):  # the refusal is remembered, and raised fresh each time
        with pytest.raises(KemError, match=r"kernel bad: 2:5: U\+00E9"):
            store.lookup("bad")


def test_the_rewrites_work_on_the_canonical_text():
    hidden = "@group(0) @binding(0) var<storage, read> a: array<u32>;\n@group(0) @binding(1) var<storage, read_write> b: array<u32>;\n" \
             "@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n" \
             "    var e = 0u; // x\fe = a[gid.x + 64u];\n    b[gid.x] = a[gid.x] + e;\n}\n"
    body = rewrite(hidden, "main").source.split("// kem: one dispatch")[0]
    assert "a[" not in body and body.count("kem_in_at(") == 2
    # (the entry names s, so its clearing is due: an entry clears what it can name)
    cleared = zero_workgroup_memory(hidden.replace("@compute", "// y\u2028var<workgroup> s: array<u32, 8>;\n@compute")
                                    .replace("b[gid.x] = a[gid.x] + e;", "s[0] = e; b[gid.x] = a[gid.x] + e;"))
    assert "s[_kem_i] = u32();" in cleared


def test_zeroing_refuses_entry_points_or_declarations_the_tree_did_not_count():
    head = "@group(0) @binding(0) var<storage, read_write> o: array<u32>;\nvar<workgroup> w: array<u32, 4>;\n"
    for text in (head + "@compute @compute @workgroup_size(1) fn main() { o[0] = w[0]; }",
                 head + "var<workgroup,> v: u32;\n@compute @workgroup_size(1) fn main() { o[0] = w[0] + v; }"):
        with pytest.raises(KemError) as err:
            zero_workgroup_memory(text)
        assert err.value.reason == "kernel_rejected"


def test_a_kernel_the_lexer_refuses_is_a_structured_error_through_the_port(kernel_dir, rng):
    (kernel_dir / "weird.wgsl").write_bytes((KERNELS / "double.wgsl").read_bytes().replace(b"fn main", "fn m\u0430in".encode()))
    (kernel_dir / "dressed.wgsl").write_bytes((KERNELS / "double.wgsl").read_text().replace("\n", "\u2028// \u00e9\r\n").encode())
    with start_port(KEM_KERNEL_DIR=str(kernel_dir)) as port:
        with pytest.raises(PortError) as err:
            port.call("execute_kernel", b"weird", bytes(16), 1)
        assert err.value.reason == "bad_kernel" and "U+0430" in err.value.detail
        for words in (1, 63, 1000):
            x = rng.integers(0, 2**32, words, dtype=np.uint32)
            out = port.call("execute_kernel", b"dressed", x.tobytes(), 1)
            assert np.array_equal(np.frombuffer(out, np.uint32), x * np.uint32(2))


def test_canonical_costs_little_once_a_load():
    kernel = max((p.read_text() for p in KERNELS.glob("*.wgsl")), key=len)
    small, big = (kernel * 2)[:2048], (kernel * (2**20 // len(kernel) + 1))[: 2**20]
    per_small = min(timeit.repeat(lambda: canonical(small), number=200, repeat=3)) / 200
    per_big = min(timeit.repeat(lambda: canonical(big), number=1, repeat=3))
    print(f"canonical: 2 KB {per_small * 1e3:.3f} ms, 1 MiB {per_big * 1e3:.1f} ms")
    assert per_small < 0.002 and per_big < 0.5  # ~0.02 ms and ~10 ms here, with room for a loaded machine
