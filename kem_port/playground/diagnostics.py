"""A check's error text as diagnostics the editor can place: line, column
and one message each.

naga's report names where it failed as ``┌─ playground:LINE:COL`` under a line such
as ``Shader 'playground' parsing error: ...``; kem's own refusals (the contract, the
canonical lexer: "LINE:COLUMN: U+XXXX: why") either carry a place or are
about the whole kernel (line 0: shown above the editor, not on a line).
Canonical text keeps every line and column (gpu/wgsl/wgsl_canonical.py),
so the places point into the author's own text.
"""

from __future__ import annotations

import re

# The excerpt's "┌─ LABEL:L:C": the label is the kernel's id since every
# compile names its module (the playground's is "playground"), "wgsl" or
# empty before; a plain "wgsl:L:C" elsewhere in older reports.
NAGA_PLACE = re.compile(r"┌─\s*[^\s:]*:(\d+):(\d+)|wgsl:(\d+):(\d+)")
LEXER_PLACE = re.compile(r"(?:^|: )(\d+):(\d+): (.*)")
MAX_MESSAGE = 300  # characters: the page shows one line a diagnostic


# The port's refusals speak Erlang to a node's caller (`debug => true`,
# `#{c => Bytes}`, `(atom or binary)`; a caller's own term by its text,
# wire/terms.shown); the page's author sees its own form:
# a debug switch, output sizes, constants, plain names (the CLI does the
# same with its flags, cli/console.cli_words).
_PAGE_WORDS: tuple[tuple[str, str], ...] = (
    (r"<<\"([^\"]*)\">>", r"\1"),
    (r"\bcall with debug => true", "run with Debug on"),
    (r"\bdebug => true", "Debug on"),
    (r"\bgrid => \{X, ?Y, ?Z\}", "a grid"),
    (r"\bworkgroups => \{X, ?Y, ?Z\}", "workgroups"),
    (r"\boutputs => #\{(\w+) => Bytes\}", r"an output size for \1"),
    (r"\bbuffers => #\{(\w+) => Bin\}", r"an input for \1"),
    (r"\bconstants => #\{(\w+) => Value\}", r"a constant \1=VALUE"),
    (r"\bconstants must be a map #\{Name => Number\}", "constants are NAME=VALUE, ..."),
    (r"\{X, ?Y, ?Z\}", "X,Y,Z"),
    (r" \((?:atoms or binaries|atom or binary)\)", ""),
    (r"\boutput_size_hint\b", "hint"),
)


def page_words(detail: str) -> str:
    """A refusal's detail in the page's words (no Erlang terms, no decoder types)."""
    for pattern, words in _PAGE_WORDS:
        detail = re.sub(pattern, words, detail)
    return detail


def diagnostics(reason: str, detail: str) -> list[dict]:
    """[{line, col, message}] for one refusal; line 0 means the whole kernel."""
    detail = page_words(detail)
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    message = _headline(lines) or reason
    place = NAGA_PLACE.search(detail)
    if place:
        line, col = place.group(1, 2) if place.group(1) else place.group(3, 4)
        return [{"line": int(line), "col": int(col), "message": _short(f"{reason}: {message}")}]
    lexed = LEXER_PLACE.search(lines[0]) if lines else None
    if lexed:
        return [{"line": int(lexed.group(1)), "col": int(lexed.group(2)), "message": _short(f"{reason}: {lexed.group(3)}")}]
    return [{"line": 0, "col": 0, "message": _short(f"{reason}: {message}")}]


def _headline(lines: list[str]) -> str:
    """The line that names the error (not "Validation Error", "Caused by:"
    or "In wgpuDeviceCreateShaderModule")."""
    if len(lines) <= 1:
        return lines[0] if lines else ""
    named = [line for line in lines[1:] if "error" in line.lower() and not line.startswith("In ")]
    text = named[0] if named else lines[-1]
    return re.sub(r"Shader '[^']*' ", "", text)


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
