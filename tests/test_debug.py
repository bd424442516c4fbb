"""The debug channel: a kernel appends u32 records at @binding(15) and, in
debug mode, kem returns them beside the result (docs/debug.md)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import start_port
from kem_port.wire import terms
from kem_port.client import PortError, plain
from kem_port.gpu.debug_run import RECORDS

DEBUG_HEADER = """
struct KemDebug { count: atomic<u32>, records: array<u32> }
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(15) var<storage, read_write> kem_debug: KemDebug;
fn kem_print(v: u32) {
    let i = atomicAdd(&kem_debug.count, 1u);
    if (i < arrayLength(&kem_debug.records)) { kem_debug.records[i] = v; }
}
"""
# Doubles each word; records the index of every word divisible by 7.
SEVENS = DEBUG_HEADER + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i] * 2u;
    if (input_words[i] % 7u == 0u) { kem_print(i); }
}
"""
# Records every index: more than the channel holds, for large inputs.
EVERY = DEBUG_HEADER + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&output_words)) { return; }
    output_words[i] = input_words[i];
    kem_print(i);
}
"""
DEBUG = {terms.atom("debug"): True}


@pytest.fixture(scope="module")
def debug_port(tmp_path_factory):
    kernels = tmp_path_factory.mktemp("kernels")
    (kernels / "sevens.wgsl").write_text(SEVENS)
    (kernels / "every.wgsl").write_text(EVERY)
    with start_port(KEM_KERNEL_DIR=str(kernels)) as port:
        yield port


def debug_call(port, kernel: bytes, data: bytes) -> tuple[bytes, dict]:
    result, debug = port.call("execute", kernel, data, DEBUG)
    return terms.binary_bytes(result), plain(debug)


@pytest.mark.parametrize("words", [1, 63, 1000, 5003])
def test_records_beside_the_result(debug_port, rng, words):
    data = rng.integers(0, 2**31, words, dtype=np.uint32)
    out, debug = debug_call(debug_port, b"sevens", data.tobytes())
    np.testing.assert_array_equal(np.frombuffer(out, dtype=np.uint32), data * 2)
    expected = np.flatnonzero(data % 7 == 0)
    assert sorted(debug["records"]) == expected.tolist()  # invocations append in any order
    assert (debug["dropped"], debug["capacity"]) == (0, RECORDS)


def test_records_are_bounded_and_the_rest_counted(debug_port, rng):
    words = RECORDS + int(rng.integers(1, 3000))
    data = rng.integers(0, 2**32, words, dtype=np.uint32)
    out, debug = debug_call(debug_port, b"every", data.tobytes())
    assert out == data.tobytes()
    assert len(debug["records"]) == RECORDS and debug["dropped"] == words - RECORDS
    assert len(set(debug["records"])) == RECORDS and max(debug["records"]) < words


def test_debug_channel_only_in_debug_mode(debug_port):
    with pytest.raises(PortError) as caught:
        debug_port.call("execute", b"sevens", b"\x07\x00\x00\x00", {})
    assert caught.value.reason == "bad_kernel" and "debug => true" in caught.value.detail
    # ... and the debug call after it still works: the pipelines do not mix.
    out, debug = debug_call(debug_port, b"sevens", b"\x07\x00\x00\x00")
    assert out == b"\x0e\x00\x00\x00" and debug["records"] == [0]


def test_debug_mode_on_a_kernel_without_the_channel(debug_port, rng):
    data = rng.integers(0, 256, 4097, dtype=np.uint8).tobytes()
    out, debug = debug_call(debug_port, b"double", data)
    assert out == __import__("reference").double(data, len(data))
    # and its gas (docs/metering.md): no loop, so the invocations it launched
    assert debug == {"records": [], "dropped": 0, "capacity": RECORDS, "gas": -(-(-(-len(data) // 4)) // 256) * 256}  # words, workgroups of 256


def test_debug_must_be_a_boolean(debug_port):
    with pytest.raises(PortError) as caught:
        debug_port.call("execute", b"sevens", b"\x07\x00\x00\x00", {terms.atom("debug"): 1})
    assert (caught.value.reason, caught.value.detail) == ("bad_args", "debug must be true or false")


def test_kem_run_prints_the_records(tmp_path):
    from cli_helpers import kem

    kernel = tmp_path / "sevens.wgsl"
    kernel.write_text(SEVENS)
    words = np.array([7, 1, 14, 3, 21], dtype=np.uint32)
    done = kem(tmp_path, "run", str(kernel), "--hex", words.tobytes().hex(), "--debug", "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").read_bytes() == (words * 2).tobytes()
    line = done.stderr.decode().strip().splitlines()[-1]
    head, records = line.rsplit(": ", 1)
    assert head == "kem: debug: 3 records, 0 dropped" and sorted(map(int, records.split())) == [0, 2, 4]
