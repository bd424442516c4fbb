"""The bytes of a kernel's ``var<workgroup>`` memory, by WGSL's layout
rules, for gpu/workgroup_limits.py, which holds an entry point's sum to the
device's ``maxComputeWorkgroupStorageSize`` (wgpu-native does not; an H100's
port was stuck for good by 256 KiB). Declarations are read as
wgsl_workgroup.py reads them, on the canonical text.
"""

from __future__ import annotations

import re
from typing import Callable

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import canonical
from kem_port.gpu.wgsl.wgsl_counts import count_value
from kem_port.gpu.wgsl.wgsl_layout import _SCALARS, _SHORT_MAT, _SHORT_VEC, _SUFFIX, _matrix, _round, _vector
from kem_port.gpu.wgsl.wgsl_workgroup import (MAX_ALIAS_STEPS, MAX_REPLACED_CHARS, UNREAD, _STRUCT, _declarations, _followed,
                                              _replace_consts, _split_array, _struct_members)

_VEC = re.compile(r"vec([234])\s*<\s*(\w+)\s*>")
_MAT = re.compile(r"mat([234])x([234])\s*<\s*(\w+)\s*>")
_ATOMIC = re.compile(r"atomic\s*<\s*(?:u32|i32)\s*>")
_MEMBER_ATTR = re.compile(r"@\s*(size|align)\s*\(([^()]*)\)")
_ANY_ATTR = re.compile(r"@\s*(?:size|align)\b")


def workgroup_bytes(source: str) -> tuple[tuple[str, str | None], ...]:
    """(name, size in bytes) of each module-scope var<workgroup>, by WGSL's
    layout rules (alignment and size of scalars, vectors, matrices, atomics,
    arrays and structs with their @size/@align), aliases followed and consts
    replaced. A size is text: an override-sized array's is an expression
    (``(N) * 256``) that gpu/workgroup_limits.py evaluates per constants
    set; None where kem cannot read the type. Read on the canonical text, as
    workgroup_vars is."""
    try:
        code = canonical(source)
        found_decls = _declarations(code)
    except KemError:
        return ()
    structs = {m.group(1): _struct_members(m.group(2)) for m in _STRUCT.finditer(code)}
    sizes = _Bytes(found_decls["alias"], structs, found_decls["const"])
    found = []
    for name, type_text in found_decls["workgroup"].items():
        layout = sizes.layout(sizes.consts_replaced(type_text))
        found.append((name, None if layout is None else layout[1]))
    return tuple(found)


class _Bytes:
    """(align, size text) of a type, by the WGSL spec's "Alignment and
    Size" table; None for what it cannot read (an unknown name, a count
    it cannot write, a nesting past MAX_ALIAS_STEPS)."""

    def __init__(self, aliases: dict[str, str], structs: dict[str, tuple[tuple[str, str], ...]], consts: dict[str, str]) -> None:
        self.aliases, self.structs, self.consts = aliases, structs, consts
        self.done: dict[str, tuple[int, str] | None] = {}
        self.budget = [MAX_REPLACED_CHARS]

    def consts_replaced(self, text: str) -> str:
        return _replace_consts(text, self.consts, self.budget)

    def layout(self, text: str, steps: int = MAX_ALIAS_STEPS) -> tuple[int, str] | None:
        text = _followed(text, self.aliases)
        if steps <= 0 or text == UNREAD:
            return None
        if text in self.structs:  # before the predeclared names: a kernel may declare struct vec4f
            if text not in self.done:
                self.done[text] = None  # a struct cannot hold itself
                self.done[text] = self._struct(self.structs[text], steps)
            return self.done[text]
        fixed = _fixed(text, self._scalar)
        if fixed is not None:
            return fixed[0], str(fixed[1])
        split = _split_array(text)
        if split is None or not split[1]:
            return None
        element = self.layout(split[0], steps - 1)
        if element is None:
            return None
        align, size = element
        # An array's stride is its element's size rounded to its alignment;
        # an element of expression size is an array already a multiple of it.
        stride = str(_round(int(size), align)) if size.isdigit() else f"({size})"
        count = count_value(split[1], {})
        if count is not None and stride.isdigit():
            return align, str(count * int(stride))
        return align, f"({split[1]}) * {stride}"

    def _scalar(self, name: str) -> int | None:
        """A vector's or matrix's scalar name, aliases followed: a kernel may
        shadow f16 (alias f16 = f32; naga lays vec4<f16> out as 16 bytes:
        read as 8, 4,096 of them counted 32 KiB of 64, red team 9)."""
        name = _followed(name, self.aliases)
        if name in self.structs:
            return None
        return 4 if name == "bool" else _SCALARS.get(name)

    def _struct(self, members: tuple[tuple[str, str], ...], steps: int) -> tuple[int, str] | None:
        offset, largest = 0, 1
        for head, type_text in members:
            member = self.layout(self.consts_replaced(type_text), steps - 1)
            size = count_value(member[1], {}) if member is not None else None
            if member is None or size is None:
                return None  # WGSL sizes a struct's members by creation-fixed types only
            read = _MEMBER_ATTR.findall(head)
            if len(read) != len(_ANY_ATTR.findall(head)):
                return None  # an @size(f()) the pattern does not read could hide bytes
            attrs = {}
            for key, arg in read:
                attrs[key] = count_value(self.consts_replaced(arg), {})
                if attrs[key] is None or attrs[key] <= 0:
                    return None  # an @size or @align kem cannot read could hide bytes: unread
            align, size = attrs.get("align", member[0]), attrs.get("size", size)
            offset, largest = _round(offset, align) + size, max(largest, align)
        return largest, str(_round(offset, largest))


def _fixed(text: str, scalar_of: Callable[[str], int | None]) -> tuple[int, int] | None:
    """A scalar's, vector's, matrix's or atomic's (align, size); None for
    any other type. scalar_of sizes a long form's scalar name (vec4<T>)."""
    if text in _SCALARS or text == "bool":
        size = _SCALARS.get(text, 4)
        return size, size
    if _ATOMIC.fullmatch(text):
        return 4, 4
    for pattern, short in ((_VEC, _SHORT_VEC), (_MAT, _SHORT_MAT)):
        long_form, short_form = pattern.fullmatch(text), short.fullmatch(text)
        if long_form is None and short_form is None:
            continue
        if long_form is not None:
            *dims, scalar_name = long_form.groups()
            scalar = scalar_of(scalar_name)
        else:
            *dims, suffix = short_form.groups()
            scalar = _SUFFIX[suffix]
        if scalar is None:
            return None
        sizes = [int(d) for d in dims]
        return _vector(sizes[0], scalar) if len(sizes) == 1 else _matrix(sizes[0], sizes[1], scalar)
    return None
