"""No memory of one caller visible to another (issue 13, item 2): on
lavapipe a kernel that declared a workgroup array and never wrote it read
back another caller's input. kem clears workgroup variables at the start of
each entry point (admission/zeroing.py) where the adapter leaks."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import start_port
from kem_port.errors import KemError
from kem_port.admission.zeroing import strip_comments, zero_workgroup_memory

HEAD = """@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
"""
WRITER = HEAD + """var<workgroup> secret: array<u32, 256>;
var<workgroup> tally: atomic<u32>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) w: vec3<u32>) {
    let k = w.x * 256u + i;
    secret[i] = inp[k];
    atomicAdd(&tally, inp[k]);
    workgroupBarrier();
    out[k] = secret[255u - i];
}
"""
# Reads the same declarations and writes none of them: WGSL says zeros.
READER = HEAD + """var<workgroup> secret: array<u32, 256>;
var<workgroup> tally: atomic<u32>;
@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let i = l.x + l.y * 16u;
    out[w.x * 256u + i] = secret[i] | atomicLoad(&tally) | (inp[0] & 0u);
}
"""
# A workgroup reduction: per 64 words, their sum, through workgroup memory.
REDUCE = HEAD + """struct Local { @builtin(local_invocation_index) index: u32, @builtin(workgroup_id) group: vec3<u32> }
var<workgroup> partial: array<u32, 64>;
@compute @workgroup_size(64)
fn main(local: Local) {
    partial[local.index] = inp[local.group.x * 64u + local.index];
    workgroupBarrier();
    for (var step = 32u; step > 0u; step = step / 2u) {
        if (local.index < step) { partial[local.index] += partial[local.index + step]; }
        workgroupBarrier();
    }
    if (local.index == 0u) { out[local.group.x] = partial[0]; }
}
"""


@pytest.fixture
def wg_port(kernel_dir):
    for name, text in (("wg_write", WRITER), ("wg_read", READER), ("reduce", REDUCE)):
        (kernel_dir / f"{name}.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        yield port


def test_a_callers_workgroup_secrets_never_reach_the_next(wg_port, rng):
    for groups in (1, 3, 8):
        secret = rng.integers(1, 2**32, 256 * groups, dtype=np.uint32)
        written = np.frombuffer(wg_port.call("execute_kernel", b"wg_write", secret.tobytes(), 1), np.uint32)
        assert np.array_equal(written, secret.reshape(groups, 256)[:, ::-1].ravel())
        read = wg_port.call("execute", b"wg_read", bytes(1024 * groups), {"workgroups": (groups, 1, 1)})
        assert not any(read), "workgroup memory leaked from the previous caller"


def test_no_leak_inside_one_batch(wg_port, rng):
    secrets = [rng.integers(1, 2**32, 256, dtype=np.uint32) for _ in range(40)]
    futures = []
    for secret in secrets:  # interleaved: batches mix writers and readers
        futures.append(wg_port.call_async("execute_kernel", b"wg_write", secret.tobytes(), 1))
        futures.append(wg_port.call_async("execute", b"wg_read", bytes(1024), {"workgroups": (1, 1, 1)}))
    for secret, writer, reader in zip(secrets, futures[::2], futures[1::2]):
        assert np.frombuffer(writer.result(60), np.uint32).tolist() == secret[::-1].tolist()
        assert not any(reader.result(60))


def test_cleared_kernels_still_compute_right(wg_port, rng):
    for groups in (1, 5, 64):
        words = rng.integers(0, 2**26, 64 * groups, dtype=np.uint32)
        out = wg_port.call("execute", b"reduce", words.tobytes(), {"output_size": 4 * groups, "workgroups": (groups, 1, 1)})
        assert np.frombuffer(out, np.uint32).tolist() == words.reshape(groups, 64).sum(axis=1, dtype=np.uint32).tolist()


def test_the_probe_sees_the_leak_and_the_rewrite_closes_it():
    from kem_port.admission.probe import open_device, workgroup_memory_leaks

    adapter, device = open_device(None)
    leaks = workgroup_memory_leaks(device)
    print(f"{adapter.info.get('device')}: workgroup memory leaks between dispatches: {leaks}")
    assert not workgroup_memory_leaks(device, zero_workgroup_memory)


def test_rewrite_uses_the_index_a_kernel_already_has():
    assert "_kem_lii" not in zero_workgroup_memory(WRITER)  # parameter i
    assert "local.index" in zero_workgroup_memory(REDUCE)  # struct member
    assert "@builtin(local_invocation_index) _kem_lii: u32, @builtin(global" in zero_workgroup_memory(READER)
    assert zero_workgroup_memory(HEAD + "@compute @workgroup_size(1) fn main() {}") == HEAD + "@compute @workgroup_size(1) fn main() {}"


def test_rewrite_ignores_comments_and_refuses_what_it_cannot_clear():
    commented = HEAD + "// var<workgroup> fake: u32;\n/* var<workgroup> /* nested */ also: u32; */\n@compute @workgroup_size(1) fn main() {}"
    assert zero_workgroup_memory(commented) == commented
    text = "a /* b /* c */ d */ e // f\ng"
    assert strip_comments(text).split() == ["a", "e", "g"] and len(strip_comments(text)) == len(text)
    # A ladder of structs, each holding the one below twice, would need 2^k
    # clearing statements member by member: refused past a bound, not built.
    ladder = "struct S0 { n: atomic<u32> }\n" + "".join(f"struct S{k} {{ a: S{k - 1}, b: S{k - 1} }}\n" for k in range(1, 13))
    with pytest.raises(KemError) as err:
        zero_workgroup_memory(HEAD + ladder + "var<workgroup> s: S12;\n@compute @workgroup_size(1) fn main() { _ = &s; }")
    assert err.value.reason == "kernel_rejected"


# Issue 24: a declaration the clearing did not see (a comment ended by a line
# break kem's comment stripper did not know, or U+200E, which naga reads as
# blankspace, inside ``var<...>``) was compiled by naga and never cleared.
HIDDEN_DECLARATIONS = {
    "FF": "// scratch\fvar<workgroup> secret: array<u32, 256>;\n",
    "LS": "// scratch\u2028var<workgroup> secret: array<u32, 256>;\n",
    "LRM": "var<\u200eworkgroup> secret: array<u32, 256>;\n",
}
HIDDEN_READER = HEAD + """{decl}@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    let i = l.x + l.y * 16u;
    out[w.x * 256u + i] = secret[i] | (inp[0] & 0u);
}
"""


@pytest.mark.parametrize("how", sorted(HIDDEN_DECLARATIONS))
def test_a_hidden_workgroup_declaration_is_cleared_too(kernel_dir, rng, how):
    (kernel_dir / "wg_write.wgsl").write_text(WRITER)
    (kernel_dir / "wg_hidden.wgsl").write_bytes(HIDDEN_READER.replace("{decl}", HIDDEN_DECLARATIONS[how]).encode())
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        for groups in (4, 8, 4, 8, 4, 8):  # a leak shows in most rounds on lavapipe, not all
            secret = rng.integers(1, 2**32, 256 * groups, dtype=np.uint32)
            port.call("execute_kernel", b"wg_write", secret.tobytes(), 1)
            read = port.call("execute", b"wg_hidden", bytes(1024 * groups), {"workgroups": (groups, 1, 1)})
            assert not any(read), f"workgroup memory leaked from the previous caller ({how})"


# Compatibility sweep (issue 25: real kernels as their authors wrote them).
# A workgroup size written as an expression (a scan over a block of 2N
# elements by N invocations): the clearing loop's stride once took only the
# tokens tree-sitter parsed, "u32(/ 2)", and a valid kernel failed to compile.
BLOCK_SCAN = HEAD + """const BLOCK: u32 = 128u;
var<workgroup> chunk: array<u32, BLOCK>;
@compute @workgroup_size(BLOCK / 2, 1)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) w: vec3<u32>) {
    let base = w.x * BLOCK;
    chunk[2u * i] = inp[base + 2u * i];
    chunk[2u * i + 1u] = inp[base + 2u * i + 1u];
    workgroupBarrier();
    out[w.x * (BLOCK / 2u) + i] = chunk[BLOCK - 1u - 2u * i] * 3u + chunk[i];
}
"""
# A histogram in a workgroup struct of atomics (a scalar, an array and an
# array of arrays of them, beside a plain member): once refused outright on
# an adapter that leaks workgroup memory; now cleared member by member.
TALLY = """struct Tally { count: atomic<u32>, bins: array<atomic<u32>, 16>, grid: array<array<atomic<u32>, 4>, 4>, seen: u32 }
alias TallyAlias = Tally;
var<workgroup> tally: TallyAlias;
"""
HISTOGRAM = HEAD + TALLY + """@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) w: vec3<u32>) {
    let v = inp[w.x * 64u + i];
    atomicAdd(&tally.count, 1u);
    atomicAdd(&tally.bins[v % 16u], 1u);
    atomicAdd(&tally.grid[v % 4u][(v / 4u) % 4u], 1u);
    workgroupBarrier();
    if (i < 16u) { out[w.x * 33u + i] = atomicLoad(&tally.bins[i]); }
    else if (i < 32u) { out[w.x * 33u + i] = atomicLoad(&tally.grid[(i - 16u) / 4u][i % 4u]); }
    else if (i == 32u) { out[w.x * 33u + i] = atomicLoad(&tally.count) + tally.seen; }
}
"""
# Reads the struct and writes none of it: WGSL says zeros.
TALLY_READER = HEAD + TALLY + """@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) w: vec3<u32>) {
    out[w.x * 64u + i] = atomicLoad(&tally.bins[i % 16u]) | atomicLoad(&tally.grid[i % 4u][i / 16u])
        | atomicLoad(&tally.count) | tally.seen | (inp[0] & 0u);
}
"""


def test_a_workgroup_size_expression_is_cleared_with_it_whole(kernel_dir, rng):
    # the port compiles the rewritten text: the first call shows a broken rewrite
    (kernel_dir / "scan.wgsl").write_text(BLOCK_SCAN)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        for groups in (1, 3, 17):
            words = rng.integers(0, 2**20, 128 * groups, dtype=np.uint32)
            out = port.call("execute", b"scan", words.tobytes(), {"output_size": 256 * groups, "workgroups": (groups, 1, 1)})
            blocks = words.reshape(groups, 128)
            want = blocks[:, 127 - 2 * np.arange(64)] * np.uint32(3) + blocks[:, :64]
            assert np.frombuffer(out, np.uint32).tolist() == want.ravel().tolist()


def test_a_workgroup_struct_of_atomics_is_cleared_member_by_member(kernel_dir, rng):
    (kernel_dir / "histogram.wgsl").write_text(HISTOGRAM)
    (kernel_dir / "tally_read.wgsl").write_text(TALLY_READER)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        for groups in (1, 4, 9, 4):
            values = rng.integers(0, 2**16, 64 * groups, dtype=np.uint32)
            out = np.frombuffer(port.call("execute", b"histogram", values.tobytes(),
                                          {"output_size": 4 * 33 * groups, "workgroups": (groups, 1, 1)}), np.uint32)
            for g, row in enumerate(out.reshape(groups, 33)):
                v = values[64 * g : 64 * (g + 1)]
                assert row[:16].tolist() == np.bincount(v % 16, minlength=16).tolist()
                assert row[16:32].tolist() == np.bincount((v % 4) * 4 + (v // 4) % 4, minlength=16).tolist()
                assert row[32] == 64
            read = port.call("execute", b"tally_read", bytes(256 * groups), {"workgroups": (groups, 1, 1)})
            assert not any(read), "a workgroup struct of atomics leaked from the previous caller"


# A workgroup array sized by an override constant, named through an alias
# (kernels templated by the host): cleared as "W = Tile()", which naga
# refuses (an override-sized array is not constructible): a valid kernel
# failed to compile. The alias is followed and the array cleared by element.
OVERRIDE_TILE = HEAD + """override HALF: u32 = 32u;
alias Tile = array<u32, HALF * 2u>;
var<workgroup> tile: Tile;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) w: vec3<u32>) {
    tile[i] = inp[w.x * 64u + i];
    workgroupBarrier();
    out[w.x * 64u + i] = tile[63u - i] ^ tile[i];
}
"""


def test_an_override_sized_workgroup_array_behind_an_alias_is_cleared(kernel_dir, rng):
    (kernel_dir / "tile.wgsl").write_text(OVERRIDE_TILE)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir), KEM_CACHE_DIR=str(kernel_dir / "cache")) as port:
        for groups in (1, 2, 7):
            words = rng.integers(0, 2**32, 64 * groups, dtype=np.uint32)
            out = port.call("execute", b"tile", words.tobytes(), {"workgroups": (groups, 1, 1)})
            blocks = words.reshape(groups, 64)
            assert np.frombuffer(out, np.uint32).tolist() == (blocks[:, ::-1] ^ blocks).ravel().tolist()


def test_many_entry_points_are_each_cleared_in_one_pass():
    """BEFORE (review of session 8): the clearing asked, entry point by
    entry point, which variables it names (used_names lexed and walked the
    whole kernel each time) and built its type table again for each: 3,000
    entry points of a 277 KB kernel took 115 s here, a stranger's stall of
    admission. Now one pass (wgsl_calls.names_reached): 0.55 s. Each entry
    clears what it names, and only that."""
    import time

    n = 3000
    text = HEAD + "var<workgroup> w: array<u32, 64>;\nvar<workgroup> v: array<u32, 64>;\n" + ("// " + "x" * 200 + "\n") * 500
    text += "".join(f"@compute @workgroup_size(1) fn e{i}() {{ out[{i}] = {'w' if i % 2 else 'v'}[0]; }}\n" for i in range(n))
    started = time.perf_counter()
    cleared = zero_workgroup_memory(text)
    took = time.perf_counter() - started
    print(f"\n{n} entry points, {len(text)} bytes: cleared in {took:.2f} s")
    assert cleared.count("w[_kem_i]") == n // 2 and cleared.count("v[_kem_i]") == n // 2
    assert took < 30, took  # liveness only: 115 s before


FALSE_EDGE = HEAD + """var<workgroup> w: array<u32, 64>;
fn total() -> u32 {
    var sum = 0u;
    for (var k = 0u; k < 64u; k++) { sum += w[k]; }
    return sum;
}
@compute @workgroup_size(64)
fn sum(@builtin(local_invocation_index) i: u32) { out[i] = total() + inp[0]; }
"""


def test_a_local_named_like_an_entry_point_does_not_cut_its_clearing():
    """BEFORE (review's red team, 1af3e15): the local `sum` in total() read
    as a call of the entry point sum closed a cycle naga accepts; the walk
    cut it short and sum cleared nothing, so total() read the previous
    caller's w back (on lavapipe, 256 of its secret words in 4 rounds of 6).
    A function on such a cycle now clears every variable."""
    cleared = zero_workgroup_memory(FALSE_EDGE)
    prologue = cleared.split("fn sum(", 1)[1].split("workgroupBarrier();", 1)[0]
    assert "w[_kem_i]" in prologue, prologue
