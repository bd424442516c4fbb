"""A workgroup variable's type, read from the kernel's declarations: whether
it holds atomics (which cannot be assigned) and the statements that zero it
part by part (admission/zeroing.py clears workgroup memory with them).

Compatibility sweep (issue 25): wgpu's own zero-init test and naga's atomic
tests keep atomics in a workgroup struct (a scalar, an array, an array of
arrays beside plain members); kem refused every such kernel on an adapter
that leaks workgroup memory. They are now cleared member by member.
"""

from __future__ import annotations

import re

from kem_port.errors import KemError

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ARRAY = re.compile(r"array\s*<(.*)>", re.S)
ATOMIC = re.compile(r"atomic\s*<[^<>]*>")


def var_label(type_text: str) -> str:
    return type_text[:60]


def cannot_clear(type_text: str) -> KemError:
    return KemError("kernel_rejected", f"workgroup variable {var_label(type_text)} cannot be cleared on this adapter")


# Statements clearing one variable part by part. Real kernels' structs of
# atomics need a handful (wgpu's zero-init test: 3); a ladder of structs
# holding the one below twice needs 2^depth: refused past the bound.
MAX_CLEAR_PARTS = 256


def clear_parts(lvalue: str, type_text: str, types: "Types", depth: int, emitted: list[int]) -> list[str]:
    """WGSL statements that zero lvalue of a type holding atomics (which
    cannot be assigned): atomicStore for each atomic, a loop for each
    array, member by member for each struct, assignment for the rest."""
    emitted[0] += 1
    if emitted[0] > MAX_CLEAR_PARTS:
        raise KemError("kernel_rejected", f"a workgroup variable needs over {MAX_CLEAR_PARTS} statements to clear on this adapter")
    type_text = types.resolve(type_text)
    if not types.holds_atomic(type_text):
        return [f"{lvalue} = {type_text}();"]
    if ATOMIC.fullmatch(type_text):
        return [f"atomicStore(&{lvalue}, 0);"]
    array = ARRAY.fullmatch(type_text)
    element, count = split_last_arg(array.group(1)) if array else ("", "")
    if count:
        i = f"_kem_j{depth}"
        inner = " ".join(clear_parts(f"{lvalue}[{i}]", element, types, depth + 1, emitted))
        return [f"for (var {i}: u32 = 0u; {i} < u32({count}); {i}++) {{ {inner} }}"]
    members = types.members(type_text)
    if members is None:
        raise cannot_clear(type_text)
    return [line for name, member in members for line in clear_parts(f"{lvalue}.{name}", member, types, depth, emitted)]


def split_last_arg(args: str) -> tuple[str, str]:
    depth = 0
    for i in range(len(args) - 1, -1, -1):
        ch = args[i]
        if ch in ">)":
            depth += 1
        elif ch in "<(":
            depth -= 1
        elif ch == "," and depth == 0:
            return args[:i].strip(), args[i + 1 :].strip()
    return args.strip(), ""


_STRUCT_DECL = re.compile(rf"\bstruct\s+({IDENT})\s*\{{([^}}]*)\}}")
_ALIAS_DECL = re.compile(rf"\balias\s+({IDENT})\s*=([^;]*);")
_MEMBER = re.compile(rf"(?:@\s*{IDENT}\s*(?:\([^()]*\))?\s*)*({IDENT})\s*:\s*(.+)", re.S)


class Types:
    """The kernel's struct and alias declarations, each read once."""

    def __init__(self, code: str) -> None:
        self.bodies: dict[str, str] = {}
        self.structs: set[str] = set()
        # Each kind searched up to its terminator's last occurrence: one regex for
        # both rescanned the rest of the kernel for every declaration never closed
        # (20,000 lines of 'struct a {' or 'alias a=': 10-13 s, red team of wave 3).
        structs = _STRUCT_DECL.finditer(code[: code.rfind("}") + 1])
        aliases = _ALIAS_DECL.finditer(code[: code.rfind(";") + 1])
        for decl in sorted([*structs, *aliases], key=lambda m: m.start()):
            name = decl.group(1)
            if name not in self.bodies:
                self.bodies[name] = decl.group(2) if decl.re is _STRUCT_DECL else decl.group(2).strip()
                if decl.re is _STRUCT_DECL:
                    self.structs.add(name)

    def holds_atomic(self, type_text: str) -> bool:
        """Whether a type, through the structs and aliases it names, holds
        an atomic; each name visited once: a recursive walk that re-searched
        the code for every path was exponential in a ladder of structs
        naming the one below twice (14 levels: 1.1 s, doubling each level)
        and hit Python's recursion limit at ~1,000 aliases (red team)."""
        seen: set[str] = set()
        pending = [type_text]
        while pending:
            text = pending.pop()
            if "atomic" in text:
                return True
            for name in set(re.findall(IDENT, text)) - seen:
                seen.add(name)
                if name in self.bodies:
                    pending.append(self.bodies[name])
        return False

    def resolve(self, type_text: str) -> str:
        """type_text with aliases followed (at most one step per alias)."""
        for _ in range(len(self.bodies) + 1):
            if type_text in self.structs or type_text not in self.bodies:
                return type_text
            type_text = " ".join(self.bodies[type_text].split())
        return type_text

    def members(self, name: str) -> list[tuple[str, str]] | None:
        """(member, type) of struct name; None when it is no struct read."""
        if name not in self.structs:
            return None
        found = []
        for part in _split_top_level(self.bodies[name]):
            member = _MEMBER.fullmatch(part.strip())
            if member is None:
                return None
            found.append((member.group(1), " ".join(member.group(2).split())))
        return found


def _split_top_level(body: str) -> list[str]:
    """A struct body's members (commas inside <>, () or [] are not theirs)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += (ch in "<([") - (ch in ">)]")
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return [p for p in parts if p.strip()]
