"""A kernel's ``var<workgroup>`` declarations and the initializers their
sizes may name, read for gpu/constants.py, which holds an override-sized
workgroup array to the bound admission/limits.py holds literal sizes to
(issue 25, red team F2). Read on the WGSL lexer's canonical text
(gpu/wgsl/wgsl_canonical.py), as admission/zeroing.py reads the same
declarations: tree-sitter's grammar fails on a size like ``N * 2u``.
"""

from __future__ import annotations

import re

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import canonical

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_WORKGROUP_VAR = re.compile(rf"\bvar\s*<\s*workgroup\s*>\s*({_IDENT})\s*:\s*([^;]+);")
_ALIAS = re.compile(rf"\balias\s+({_IDENT})\s*=\s*([^;]+);")
_INIT = re.compile(rf"\b(const|override)\s+({_IDENT})\s*(?::[^=;]*)?=\s*([^;]+);")
_NAME = re.compile(_IDENT)
MAX_ALIAS_STEPS = 16  # real kernels alias a type once or twice; a longer chain is left unread
# Characters of type text the const replacement may write in all, per
# kernel: a stranger's 35,000 workgroup variables each naming a chain of
# consts would otherwise cost 16 passes over 4 KB each (minutes); past it,
# counts are left unread (the compile worker's limits, as before).
MAX_REPLACED_CHARS = 1 << 20


def workgroup_vars(source: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """Module-scope var<workgroup> declarations read on the canonical text
    (comments blanked), as admission/zeroing.py reads them: tree-sitter's
    grammar fails on a size like ``N * 2u``. An alias is followed up to
    MAX_ALIAS_STEPS (a stranger's 50,000 chained aliases and as many
    variables must not cost their product). What is not read here (text
    the lexer refuses, a longer chain) is left to the compile worker's
    resource limits, as before. A ``const``'s name in a type is replaced
    by its initializer (consts never name overrides), up to as many steps;
    overrides' initializers are returned for gpu/constants.py to evaluate
    with the call's values."""
    try:
        code = canonical(source)
    except KemError:
        return (), ()
    aliases = {m.group(1): " ".join(m.group(2).split()) for m in _ALIAS.finditer(code)}
    consts: dict[str, str] = {}
    overrides: dict[str, str] = {}
    for m in _INIT.finditer(code):  # the first of a name: module scope comes before functions that shadow it
        (consts if m.group(1) == "const" else overrides).setdefault(m.group(2), " ".join(m.group(3).split()))
    found, replaced, budget = [], {}, [MAX_REPLACED_CHARS]
    for m in _WORKGROUP_VAR.finditer(code):
        text = " ".join(m.group(2).split())
        for _ in range(MAX_ALIAS_STEPS):
            if text not in aliases:
                break
            text = aliases[text]
        if text not in replaced:
            replaced[text] = _replace_consts(text, consts, budget)
        found.append((m.group(1), replaced[text]))
    return tuple(found), tuple(overrides.items())


def _replace_consts(text: str, consts: dict[str, str], budget: list[int]) -> str:
    """text with each const's name replaced by its initializer, within the budget."""
    for _ in range(MAX_ALIAS_STEPS):
        if budget[0] < len(text) or not any(n in consts for n in _NAME.findall(text)):
            break
        budget[0] -= len(text)
        text = _NAME.sub(lambda n: f"({consts[n.group(0)]})" if n.group(0) in consts else n.group(0), text)
    return text
