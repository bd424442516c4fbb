"""An array count's value: WGSL's integer expressions of literals (decimal
or hex, with an ``u``/``i`` suffix), names given values (overrides), + - *
/ % (WGSL's division truncates), unary minus and min/max of two. Read by
gpu/constants.py (override-sized workgroup arrays, workgroup sizes) and
gpu/wgsl/wgsl_workgroup.py (a struct member's const-sized array)."""

from __future__ import annotations

import ast
import math
import re

_COUNT_TOKENS = re.compile(r"\s*(?:(0[xX][0-9a-fA-F]+|[0-9]+)[ui]?|([A-Za-z_][A-Za-z0-9_]*)|([-+*/%(),]))")
MAX_COUNT_CHARS = 8192
_COUNT_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
              ast.FloorDiv: lambda a, b: int(a / b), ast.Mod: lambda a, b: int(math.fmod(a, b))}  # WGSL truncates


def count_value(text: str, values: dict[str, int | float]) -> int | None:
    """An array count of integer literals, overrides' names and + - * / %
    (WGSL's integer division truncates) as a number; None when it holds
    anything else. At most MAX_COUNT_CHARS: a count is a few tokens, a
    struct's (wgsl_workgroup.py) its members' counts summed."""
    parts, at = [], 0
    while at < len(text.rstrip()) and len(text) <= MAX_COUNT_CHARS:
        token = _COUNT_TOKENS.match(text, at)
        if token is None:
            return None
        literal, ident, op = token.groups()
        if ident in ("min", "max"):
            parts.append(ident)
        elif ident is not None and type(values.get(ident)) is not int:
            return None
        else:
            parts.append(str(_literal(literal)) if literal else (str(values[ident]) if ident else ("//" if op == "/" else op)))
        at = token.end()
    try:
        return _evaluate(ast.parse(" ".join(parts), mode="eval").body) if parts else None
    except (SyntaxError, ZeroDivisionError, ValueError, OverflowError, RecursionError, MemoryError):
        return None


def _literal(text: str) -> int:
    return int(text, 16) if text[:2] in ("0x", "0X") else int(text)


def _evaluate(node: ast.AST) -> int:
    """An integer expression's value: literals, + - * / %, unary minus and min/max of two."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _COUNT_OPS:
        return _COUNT_OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max") \
            and len(node.args) == 2 and not node.keywords:
        return (min if node.func.id == "min" else max)(_evaluate(node.args[0]), _evaluate(node.args[1]))
    raise ValueError("not an integer count")
