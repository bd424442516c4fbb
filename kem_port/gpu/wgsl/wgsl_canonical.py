"""One canonical text per kernel: what kem analyses, rewrites and compiles.

Why: kem reads a kernel with tree-sitter (gpu/wgsl_reflect.py) and naga
compiles it; where the two disagree on what is code, kem's analyses see one
program and the GPU runs another. They did disagree (issue 24): the WGSL
spec ends a line comment at any of seven line breaks (LF, VT, FF, CR, NEL,
U+2028, U+2029) and reads U+200E / U+200F as blankspace; tree-sitter ended
comments at LF only, and kem's comment stripper at LF and CR, so a comment
ended by FF hid ``input[far]`` from the slot-form rewrite and a
``var<workgroup>`` from the clearing, while naga compiled both.

So every kernel is lexed once, here, exactly as the WGSL spec lexes it
(the "Blankspace and Line Breaks" and "Comments" sections; block comments
nest), and replaced by its canonical text: every comment character becomes
a space (a line break inside a block comment becomes "\\n"), every line
break "\\n" (CR LF " \\n"), every other blankspace " ". Line and column (in
code points) of everything that is left stay where they were, so naga's
error messages still point into the author's file. The canonical text is
plain printable ASCII, space and LF, without comments: nothing in it can be
read differently by tree-sitter and naga, and tokens are untouched, so it
compiles exactly when the original does (one exception, for the better: a
NUL inside a comment, where wgpu-native, reading the WGSL as a C string,
cut the original short).

What the lexer cannot account for is refused (``bad_kernel``, detail
"line:column: U+XXXX: why"), never passed on: outside comments, any code
point that is neither blankspace nor part of a WGSL token. That includes every non-ASCII
code point: WGSL allows Unicode identifiers (XID_Start / XID_Continue), but
the kernels of the ecosystem use ASCII ones, and an ASCII-only text leaves
no room for two parsers to classify a character differently (a
format character naga skips, a confusable tree-sitter splits on). Inside
comments anything goes: it is blanked.

The module also gives the token stream (:func:`tokens`) for analyses that
must count what naga will see (slot_kernel's binding uses, zeroing's
workgroup declarations) rather than trust a parse tree.

Cost (best of 5 on this 2-core dev machine, python 3.11; the kernel is
kem's longest packaged one, repeated; tests/test_wgsl_canonical.py
prints it): canonical() 0.02 ms for 2 KB and ~10 ms for 1 MiB (the
largest kernel kem admits), done once a load (kernel_store.py keeps the
result); the analyses' token counts 0.1-0.2 ms for 2 KB, 45-85 ms for
1 MiB, once per admission or slot form.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterator

from kem_port.errors import KemError

# The spec's line breaks and its other blankspace (WGSL 3.2, 3.3).
LINE_BREAKS = "\n\x0b\x0c\r\x85\u2028\u2029"
OTHER_BLANKSPACE = "\t \u200e\u200f"
# Printable ASCII that starts or continues a WGSL token ('/' is handled
# apart: it may start a comment). Absent: $ # " ' ` \ ? and controls.
_CODE_CHARS = "A-Za-z0-9_!%&()*+,\\-.:;<=>@\\[\\]^{|}~"
_NEEDS_CARE = re.compile(
    "|".join([
        rf"(?P<line>//[^{LINE_BREAKS}]*)",
        r"(?P<block>/\*)",
        r"(?P<crlf>\r\n)",
        r"(?P<brk>[\x0b\x0c\r\x85\u2028\u2029])",  # LF and space are already canonical
        r"(?P<blank>[\t\u200e\u200f]+)",
        rf"(?P<bad>[^ \n/{_CODE_CHARS}])",
    ])
)
# Where the next thing that needs care may start: one character class
# (with '/' before '/' or '*'), which re scans ~10x faster than the
# alternation above; _NEEDS_CARE then says what is there.
_CARE_START = re.compile(rf"[^ \n/{_CODE_CHARS}]|/[/*]")
_BLOCK_EDGE = re.compile(r"/\*|\*/")
_ANY_BREAK = re.compile(rf"\r\n|[{LINE_BREAKS}]")
_NOT_NEWLINE = re.compile(r"[^\n]")

# Tokens of canonical text (WGSL 3.4-3.6). Numbers before punctuation, so
# '.5' is a number; the alternation order makes each pattern the longest
# literal the spec allows.
_DEC_EXP = r"[eE][+-]?[0-9]+"
_NUMBER = "|".join([
    r"0[xX](?:[0-9a-fA-F]*\.[0-9a-fA-F]+|[0-9a-fA-F]+\.[0-9a-fA-F]*)(?:[pP][+-]?[0-9]+[fh]?)?",
    r"0[xX][0-9a-fA-F]+[pP][+-]?[0-9]+[fh]?",
    r"0[xX][0-9a-fA-F]+[iu]?",
    # Inside a digit run (after a lone "0" token: "000"): the run's end
    # is followed by neither "." nor an exponent, else its first token
    # would have taken it all, so only an integer or [fh] form can start
    # here. Without this, each "0" of a run rescans the run for a "."
    # (quadratic: 20 KB of zeros took 2.3 s, 1 MiB hours; red team).
    r"(?<=[0-9])(?:0|[1-9][0-9]*)[fhiu]?",
    rf"(?:[0-9]*\.[0-9]+|[0-9]+\.[0-9]*)(?:{_DEC_EXP})?[fh]?",
    rf"[0-9]+{_DEC_EXP}[fh]?",
    r"(?:0|[1-9][0-9]*)[fh]",
    r"(?:0|[1-9][0-9]*)[iu]?",
])
_PUNCT = "|".join(re.escape(p) for p in (
    "<<=", ">>=", "->", "&&", "||", "++", "--", "==", "!=", "<=", ">=", "<<", ">>",
    "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
)) + "|[&|^~!()\\[\\]{},.:;=<>+\\-*/%@]"
# (?=[0-9.]): a number starts with a digit or '.'; the guard spares re
# trying seven number forms at every letter (1 MiB: 82 -> 38 ms).
_VALUE = re.compile(rf"(?=[0-9.])(?:{_NUMBER})|[A-Za-z_][A-Za-z0-9_]*|{_PUNCT}")  # tokens' text, blanks skipped
_WORD = re.compile(rf"(?=[0-9.])(?:{_NUMBER})|([A-Za-z_][A-Za-z0-9_]*)")  # '' for a number, else an identifier
_TOKEN = re.compile(rf"(?P<blank>[ \n]+)|(?P<number>{_NUMBER})|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>{_PUNCT})")


def canonical(text: str) -> str:
    """text's canonical form (see the module docstring); KemError
    ``bad_kernel`` for anything the WGSL lexer does not account for.
    Idempotent: canonical(canonical(t)) == canonical(t)."""
    out: list[str] = []
    at = 0
    while True:
        start = _CARE_START.search(text, at)
        if start is None:
            out.append(text[at:])
            return "".join(out)
        found = _NEEDS_CARE.match(text, start.start())
        out.append(text[at : found.start()])  # plain code, spaces and LFs
        at = found.end()
        kind = found.lastgroup
        if kind == "line":
            out.append(" " * (at - found.start()))
        elif kind == "block":
            at = _block_end(text, found.start())
            out.append(_blank(text[found.start() : at]))
        elif kind == "crlf":
            out.append(" \n")
        elif kind == "brk":
            out.append("\n")
        elif kind == "blank":
            out.append(" " * (at - found.start()))
        else:
            raise _refusal(text, found.start())


def _block_end(text: str, start: int) -> int:
    """Where the block comment opened at start ends; comments nest, read
    left to right as naga does (``/*/`` opens, it does not close)."""
    depth = 0
    for edge in _BLOCK_EDGE.finditer(text, start):
        depth += 1 if edge.group() == "/*" else -1
        if depth == 0:
            return edge.end()
    line, column = position(text, start)
    raise KemError("bad_kernel", f"{line}:{column}: a block comment opened here is never closed")


def _blank(comment: str) -> str:
    """A comment as spaces, its line breaks kept as LF (CR LF as ' \\n')."""
    return _NOT_NEWLINE.sub(" ", _ANY_BREAK.sub(lambda m: " \n" if len(m.group()) == 2 else "\n", comment))


def _refusal(text: str, offset: int) -> KemError:
    char = text[offset]
    line, column = position(text, offset)
    shown = f"U+{ord(char):04X}" + (f" {char!r}" if " " < char < "\x7f" else "")
    why = "kem accepts only ASCII outside comments" if ord(char) > 0x7F else "it starts no WGSL token"
    return KemError("bad_kernel", f"{line}:{column}: {shown}: {why}")


def position(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column (code points) of offset, lines as WGSL counts them."""
    line, line_start = 1, 0
    for brk in _ANY_BREAK.finditer(text, 0, offset):
        line, line_start = line + 1, brk.end()
    return line, offset - line_start + 1


def tokens(text: str) -> Iterator[tuple[str, str, int]]:
    """(kind, value, offset) of every token of canonical(text): kind is
    "ident", "number" or "punct"; offsets are code points, the same in
    text and its canonical form."""
    code = canonical(text)
    at = 0
    for token in _TOKEN.finditer(code):
        if token.start() != at:
            raise _refusal(code, at)  # unreachable for canonical text
        at = token.end()
        if token.lastgroup != "blank":
            yield token.lastgroup, token.group(), token.start()
    if at != len(code):
        raise _refusal(code, at)


def identifier_counts(text: str) -> Counter:
    """How many times each identifier occurs as a token. findall skips
    punctuation and blanks; a number is tried first at the same places the
    token loop tries it, so no digit run is ever read as a name."""
    counts = Counter(_WORD.findall(canonical(text)))
    counts.pop("", None)
    return counts


def identifier_count(text: str, name: str) -> int:
    return identifier_counts(text)[name]


def token_values(text: str) -> list[str]:
    """The text of every token of canonical(text), blanks skipped: lexed
    once, then handed to the counts below (each of which, given text,
    would lex it again: 45-85 ms a MiB)."""
    return _VALUE.findall(canonical(text))


def identifiers_in(values: list[str]) -> Counter:
    """identifier_counts of already lexed token values."""
    return Counter(v for v in values if v[0].isalpha() or v[0] == "_")


def sequence_count(text: str, words: tuple[str, ...]) -> int:
    """How many times the token values ``words`` occur in a row."""
    return sequence_in(token_values(text), words)


def sequence_in(values: list[str], words: tuple[str, ...]) -> int:
    n = len(words)
    return sum(1 for i, value in enumerate(values) if value == words[0] and tuple(values[i : i + n]) == words)


_DECLARING = frozenset(("fn", "alias", "struct", "const", "override", "let"))


def declared_names(text: str) -> set[str]:
    """Every name text declares, at any scope: after fn, alias, struct,
    const, override, let or var (past its <...>), and any name right
    before ':' (parameters, members, typed declarations). WGSL lets a
    declaration shadow a predeclared function or type (naga follows): code
    kem adds that calls select(), workgroupBarrier() or names vec2f must
    not run where the kernel gave them its own meaning (red team)."""
    return names_declared_in(token_values(text))


def names_declared_in(values: list[str]) -> set[str]:
    names: set[str] = set()
    for i, value in enumerate(values[:-1]):
        after = values[i + 1]
        if value in _DECLARING or (value == "var" and after != "<"):
            names.add(after)
        elif value == "var":
            # var's template is a few tokens (var<storage, read_write>): a
            # bounded look, so 1 MiB of "var<" stays linear.
            depth, j, stop = 0, i + 1, min(len(values), i + 16)
            while j < stop:
                depth += {"<": 1, ">": -1, ">>": -2}.get(values[j], 0)
                j += 1
                if depth <= 0:
                    break
            if j < len(values):
                names.add(values[j])
        elif after == ":" and (value[0].isalpha() or value[0] == "_"):
            names.add(value)
    return names
