"""Red team 8: the slot form (docs/dispatch.md "the slot form") against
WGSL whose parse tree does not say what the program does.

The rewrite decided from tree-sitter's tree whether an output element is
read (then through a getter, zero past the call's output; since red team
8 a read keeps one dispatch per call) or written (indexed into the slot,
past the output onto the slot's spare element). The grammar
reads a call statement such as ``peek(dst[n + 3u], 0u);`` as ERROR around
an assignment's left side, so that READ took the write form and read the
spare element: the call's own stray write, where alone it reads zero.

The other kernels here are attacks that held (the slot form, where it is
kept, gives the lone call's bytes); they guard against regressions."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import kernels_port, stat

HEAD = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
var<private> seen: u32;
fn peek(v: u32, k: u32) { seen = v + k; }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
    let i = gid.x;
    if (i >= n) { return; }
    let w = src[i] | 1u;
"""
# The defect: an output element past the output read as a call's first
# argument (alone zero, so dst[i] = w; grouped it read the spare, w' ^ w).
CALL_ARG_READ = HEAD + """
    dst[n + 3u] = w;
    storageBarrier();
    peek(dst[n + 3u], 0u);
    dst[i] = w ^ seen;
}
"""
# Held: the same read as the second argument (the tree reads it as a read).
CALL_ARG_SECOND = HEAD + """
    dst[n + 3u] = w;
    storageBarrier();
    peek(0u, dst[n + 3u]);
    dst[i] = w ^ seen;
}
"""
# The defect: the same invocation reads back its own write past the output.
# Alone lavapipe's compiler forwards the stored w to the load (s = w, so
# dst[i] = 0), though after a barrier such a read is zero (red team 6);
# grouped, the getter read zero (dst[i] = w). A kernel that reads its
# output keeps one dispatch per call.
OWN_WRITE_READ = HEAD + """
    dst[n + 3u] = w;
    let s = dst[n + 3u];
    dst[i] = w ^ s;
}
"""
# Held: phony assignments of reads past the input and the output.
PHONY = HEAD + """
    _ = src[i + 1000u];
    _ = dst[n + 5u];
    dst[i] = w;
}
"""
# Held: writes in a loop's continuing block (the last one is w + 1).
CONTINUING = HEAD + """
    var k = 0u;
    loop {
        if (k >= 2u) { break; }
        continuing { dst[i] = w + k; dst[n + k] = 7u; k = k + 1u; }
    }
}
"""
# Held: the builtins a lone 1-D call sees (num_workgroups (g, 1, 1),
# workgroup_id z 0), with the call's own group count g.
BUILTINS = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = gid.x;
    if (i >= arrayLength(&dst)) { return; }
    dst[i] = src[i] ^ (nwg.x * 1000u + nwg.y * 100u + nwg.z * 10u + wid.z + (wid.x * 64u + li - i) + gid.z * 3u);
}
"""
VEC = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&dst)) { return; }
    let j = src[i].y % 4u;
"""
# Held: a component index on a swizzle and on a let's value (values in both
# forms: j < 4 here, so numpy's answer is well defined).
SWIZZLE_INDEX = VEC + """
    dst[i] = vec4<u32>(src[i].wzyx[j], src[i].y, src[i].z, src[i].w);
}
"""
LET_INDEX = VEC + """
    let v = src[i];
    dst[i] = vec4<u32>(v[j], v.y, v.z, v.w);
}
"""

KERNELS = {
    "call_arg_read": CALL_ARG_READ, "own_write_read": OWN_WRITE_READ, "call_arg_second": CALL_ARG_SECOND, "phony": PHONY, "continuing": CONTINUING,
    "builtins": BUILTINS, "swizzle_index": SWIZZLE_INDEX, "let_index": LET_INDEX,
}


@pytest.fixture(scope="module")
def red_port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("red8_kernels"), KERNELS) as client:
        yield client


def expected(name: str, x: np.ndarray) -> np.ndarray:
    """numpy's answer for a call alone."""
    w = x | np.uint32(1)
    if name == "own_write_read":
        return np.zeros_like(x)
    if name in ("call_arg_read", "call_arg_second", "phony"):
        return w
    if name == "continuing":
        return w + np.uint32(1)
    if name == "builtins":
        groups = -(-len(x) // 64)
        return x ^ np.uint32(groups * 1000 + 100 + 10)
    v = x.reshape(-1, 4).copy()
    j = v[:, 1] % 4
    v[:, 0] = v[np.arange(len(v)), 3 - j] if name == "swizzle_index" else v[np.arange(len(v)), j]
    return v.reshape(-1)


@pytest.mark.parametrize("name", list(KERNELS))
def test_grouped_equals_alone(red_port, rng, name):
    """Groups of six calls at three sizes: every grouped result is numpy's
    and the same call's alone (before the fix call_arg_read's grouped
    results were w ^ w', the spare element's stray write read back).
    call_arg_read keeps one dispatch per call."""
    before = stat(red_port, "slot_dispatches")
    for words in (8, 64, 256):
        red_port.call("execute_kernel", name.encode(), np.zeros(words, np.uint32).tobytes(), 1)
        inputs = [rng.integers(0, 2**31, words, dtype=np.uint32) for _ in range(6)]
        futures = red_port.call_group_async(name.encode(), [x.tobytes() for x in inputs], hint=1, timeouts_ms=60000)
        grouped = [f.result(60) for f in futures]
        for k, (x, got) in enumerate(zip(inputs, grouped)):
            alone = red_port.call("execute_kernel", name.encode(), x.tobytes(), 1)
            assert got == alone, (name, words, k)
            # own_write_read: zero where the compiler forwards the write
            # (lavapipe), w where the read goes to the binding (robust: zero).
            answers = (expected(name, x), x | np.uint32(1)) if name == "own_write_read" else (expected(name, x),)
            assert got in [a.tobytes() for a in answers], (name, words, k)
    if name in ("call_arg_read", "own_write_read", "call_arg_second", "phony"):
        assert stat(red_port, "slot_dispatches") == before


# A kernel's own function named like an atomic, given an output element's
# address as a statement: _atomic_statement trusted any name starting with
# "atomic", and atomicPeek could read the spare element (a stray atomic's
# sum, zero alone). naga of wgpu-py 0.32 refuses storage pointer parameters,
# so no such kernel is admitted today; the unrestricted_pointer_parameters
# extension would admit it. A function that shadows atomicAdd likewise.
ATOMIC_NAMED = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<atomic<u32>>;
var<private> seen: u32;
fn NAME(p: ptr<storage, atomic<u32>, read_write>) { seen = atomicLoad(p); }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
    let i = gid.x;
    if (i >= n) { return; }
    let w = src[i] | 1u;
    atomicAdd(&dst[n + 3u], w);
    NAME(&dst[n + 3u]);
    let v = w ^ seen;
    atomicAdd(&dst[i], v);
}
"""


@pytest.mark.parametrize("name", ["atomicPeek", "atomicAdd"])
def test_atomic_named_functions_keep_one_dispatch_per_call(name):
    """The rewrite (in-process: no naga of this wgpu compiles the kernel)
    refuses both; before, atomicPeek's kernel got a slot form."""
    from kem_port.gpu.group.slot_kernel import rewrite
    from kem_port.gpu.group.slot_uses import Refused

    with pytest.raises(Refused):
        rewrite(ATOMIC_NAMED.replace("NAME", name), "main")
