"""A check's error text as diagnostics the editor can place: line, column
and one message each.

naga's report names where it failed as ``wgsl:LINE:COL`` under a line such
as ``Shader '' parsing error: ...``; kem's own refusals (the contract, the
canonical lexer: "LINE:COLUMN: U+XXXX: why") either carry a place or are
about the whole kernel (line 0: shown above the editor, not on a line).
Canonical text keeps every line and column (gpu/wgsl/wgsl_canonical.py),
so the places point into the author's own text.
"""

from __future__ import annotations

import re

NAGA_PLACE = re.compile(r"wgsl:(\d+):(\d+)")
LEXER_PLACE = re.compile(r"(?:^|: )(\d+):(\d+): (.*)")
MAX_MESSAGE = 300  # characters: the page shows one line a diagnostic


def diagnostics(reason: str, detail: str) -> list[dict]:
    """[{line, col, message}] for one refusal; line 0 means the whole kernel."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    message = _headline(lines) or reason
    places = NAGA_PLACE.findall(detail)
    if places:
        line, col = places[0]
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
    return text.replace("Shader '' ", "")


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
