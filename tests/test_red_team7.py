"""Red team 7: the slot form (docs/dispatch.md "the slot form") against
kernels that index a vector binding's component at run time on a READ.

A lone call reads ``src[i][j]`` through a pointer into its own binding:
with j past 3 robust access bounds it only by the binding, so it reads the
next element's components (its own input). The slot form read the
component of a value (``kem_in_at(i)[j]``), which naga treats otherwise:
the grouped call's result must still equal the lone call's."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import kernels_port, stat

VEC = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
    let i = gid.x;
    if (i >= n) { return; }
"""
# A component index past 3 on an input read.
INPUT_COMPONENT = VEC + """
    let j = 4u + (src[i].x % 4u);
    dst[i] = vec4<u32>(src[i][j], src[i].y, src[i].z, src[i].w);
}
"""
# The same on an output read, after the output is written (components
# y, z, w of the next element: no invocation writes them after the barrier).
OUTPUT_COMPONENT = VEC + """
    dst[i] = src[i];
    storageBarrier();
    let j = 5u + (src[i].x % 3u);
    dst[i].x = dst[i][j];
}
"""

# A pointer to an output element past the output (the parentheses kept
# the rewrite from seeing a pointer): alone the write through it is
# dropped and the read is zero; grouped both reached the slot's spare
# element, so the call read its own stray value back.
POINTER_PAST = """
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&dst);
    let i = gid.x;
    if (i >= n) { return; }
    let p = &(dst[n + 3u]);
    *p = src[i] | 1u;
    storageBarrier();
    dst[i] = src[i] ^ *p;
}
"""

KERNELS = {"input_component": INPUT_COMPONENT, "output_component": OUTPUT_COMPONENT, "pointer_past": POINTER_PAST}


@pytest.fixture(scope="module")
def red_port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("red7_kernels"), KERNELS) as client:
        yield client


def expected(name: str, x: np.ndarray) -> np.ndarray:
    """numpy's answer alone: component j past 3 of element i is component
    j - 4 of element i + 1, zero past the binding."""
    if name == "pointer_past":
        return x
    v = x.reshape(-1, 4).copy()
    nxt = np.vstack([v[1:], np.zeros((1, 4), np.uint32)])
    j = (4 if name == "input_component" else 5) + v[:, 0] % (4 if name == "input_component" else 3)
    v[:, 0] = nxt[np.arange(len(v)), j - 4]
    return v.reshape(-1)


@pytest.mark.parametrize("name", list(KERNELS))
def test_vector_component_reads_grouped_equal_alone(red_port, rng, name):
    """Groups of three sizes: every grouped result is numpy's and equals the
    same call alone (before the fix grouped reads of src[i][4 + k] gave
    src[i].w). Such kernels keep one dispatch per call."""
    before = stat(red_port, "slot_dispatches")
    for words in (8, 64, 256):
        red_port.call("execute_kernel", name.encode(), np.zeros(words, np.uint32).tobytes(), 1)
        inputs = [rng.integers(1, 2**32, words, dtype=np.uint32) for _ in range(6)]
        futures = red_port.call_group_async(name.encode(), [x.tobytes() for x in inputs], hint=1, timeouts_ms=60000)
        grouped = [f.result(60) for f in futures]
        for k, (x, got) in enumerate(zip(inputs, grouped)):
            alone = red_port.call("execute_kernel", name.encode(), x.tobytes(), 1)
            assert got == alone, (name, words, k)
            assert got == expected(name, x).tobytes(), (name, words, k)
    assert stat(red_port, "slot_dispatches") == before


# Inputs and outputs that are not a whole number of vec4s: alone lavapipe's
# robust access reads and writes the in-range words of the partial last
# element; the slot form's lengths count whole elements only, so grouped
# that element read zero and its write was dropped (results differed).
PARTIAL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i > arrayLength(&dst)) { return; }
    dst[i] = src[i] + vec4<u32>(1u);
}
"""


@pytest.fixture(scope="module")
def partial_port(tmp_path_factory):
    with kernels_port(tmp_path_factory.mktemp("red7_partial"), {"partial": PARTIAL}) as client:
        yield client


def test_partial_vector_elements_grouped_equal_alone(partial_port, rng):
    """Sizes of 5, 6, 7 and 9 words on a vec4 kernel: each grouped result
    equals the call alone (whole elements are x + 1, as numpy says); whole
    sizes (8 words) keep the slot form, partial ones one dispatch per call."""
    for words in (5, 6, 7, 8, 9):
        partial_port.call("execute_kernel", b"partial", np.zeros(words, np.uint32).tobytes(), 1)
        before = stat(partial_port, "slot_dispatches")
        inputs = [rng.integers(0, 2**31, words, dtype=np.uint32) for _ in range(4)]
        futures = partial_port.call_group_async(b"partial", [x.tobytes() for x in inputs], hint=1, timeouts_ms=60000)
        for k, (x, fut) in enumerate(zip(inputs, futures)):
            got = fut.result(60)
            assert got == partial_port.call("execute_kernel", b"partial", x.tobytes(), 1), (words, k)
            whole = words // 4 * 4
            assert np.array_equal(np.frombuffer(got, np.uint32)[:whole], x[:whole] + np.uint32(1)), (words, k)
        assert stat(partial_port, "slot_dispatches") - before == (1 if words % 4 == 0 else 0), words
