"""Bulk payloads in part files (kem_shm_slots on the node's side): inputs
named as a list of files are read, a thread a part, into the upload buffer
and match numpy at sizes that are not multiples of 4 or of a part; results
are split over part files with the node's rule, written over kept files in
place but never over or through anything else; a part that shrank is that
caller's clear error."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import reference
from conftest import start_port
from kem_port.transfer import bulk_io
from kem_port.wire import terms
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.calls import KernelCall
from kem_port.transfer.file_inputs import FileParts
from kem_port.gpu.executor import Executor
from kem_port.transfer.shm import MAX_PARTS, READ_LATE, SharedMemory, write_result
from kem_port.stats import Stats
from executor_helpers import run_double, reason_of


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "kem-test"
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture(scope="module", params=["native", "wrappers"])
def executor(request):
    ex = Executor(Config(hot_path=request.param), Stats())
    ex.open()
    return ex


def write_parts(directory: Path, name: str, data: bytes, cuts: list[int]) -> list:
    """data cut at `cuts` into files name.0, name.1, ...; their paths as
    transfer/shm.py takes them (bytes)."""
    paths, bounds = [], [0, *cuts, len(data)]
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        path = directory / f"{name}.{k}"
        path.write_bytes(data[a:b])
        paths.append(str(path).encode())
    return paths


def test_inputs_in_parts_of_several_sizes_match_numpy(executor, shm_dir, rng):
    memory = SharedMemory(shm_dir, 1 << 30)
    calls, expected = [], []
    for k, (size, cuts) in enumerate([(READ_LATE, [READ_LATE // 2]),
                                       (2 * READ_LATE + 3, [5, READ_LATE + 1, 2 * READ_LATE]),
                                       (3 * READ_LATE + 1, [1, 2, 3, 3, 7 * READ_LATE // 3])]):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        late = memory.read_input(write_parts(shm_dir, f"in{k}", data, cuts))
        assert isinstance(late, FileParts) and len(late) == size
        out = size + (k - 1) * 4
        calls.append(KernelCall("double", late, out))
        expected.append(reference.double(data, out))
    for _ in range(2):  # again: the pooled upload buffers are mapped anew
        assert run_double(executor, calls) == expected


def test_small_inputs_in_parts_are_read_at_once(shm_dir, rng):
    data = rng.integers(0, 256, 1001, dtype=np.uint8).tobytes()
    got = SharedMemory(shm_dir, 1 << 20).read_input(write_parts(shm_dir, "small", data, [3, 500, 500]))
    assert bytes(got) == data


def test_a_part_that_shrank_fails_alone_with_a_clear_error(executor, shm_dir, rng):
    memory = SharedMemory(shm_dir, 1 << 30)
    data = rng.integers(0, 256, 2 * READ_LATE + 5, dtype=np.uint8).tobytes()
    bad = memory.read_input(write_parts(shm_dir, "bad", data, [READ_LATE]))
    good = memory.read_input(write_parts(shm_dir, "good", data, [READ_LATE]))
    os.truncate(shm_dir / "bad.1", 7)  # after the request was checked, before the batch reads it
    first, second = run_double(executor, [KernelCall("double", bad, 64), KernelCall("double", good, 64)])
    assert isinstance(first, KemError) and first.reason == "bad_args" and "shrank" in first.detail
    assert second == reference.double(data, 64)


def test_parts_are_refused_when_out_of_bounds(shm_dir, tmp_path):
    memory = SharedMemory(shm_dir, 1000)
    paths = write_parts(shm_dir, "p", bytes(1200), [600])
    assert reason_of(memory.read_input, paths) == "too_large"  # from the sizes: nothing read
    assert reason_of(memory.read_input, []) == "bad_args"
    assert reason_of(memory.read_input, [paths[0]] * (MAX_PARTS + 1)) == "bad_args"
    outside = tmp_path / "outside"
    outside.write_bytes(b"x")
    assert reason_of(memory.read_input, [paths[0], str(outside).encode()]) == "bad_args"
    assert reason_of(memory.read_input, [paths[0], 7]) == "bad_args"


@pytest.mark.parametrize("planted", ["link", "fifo", "dir"])
def test_a_planted_input_part_is_refused_at_once(shm_dir, tmp_path, planted):
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for the port")
    target = shm_dir / "p.1"
    if planted == "link":
        target.symlink_to(secret)
    elif planted == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    (shm_dir / "p.0").write_bytes(b"abcd")
    memory = SharedMemory(shm_dir, 1 << 20)
    outcome: dict[str, str | None] = {}
    reader = threading.Thread(target=lambda: outcome.update(
        reason=reason_of(memory.read_input, [str(shm_dir / "p.0").encode(), str(target).encode()])), daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "the reader blocked"
    assert outcome["reason"] == "bad_args"


@pytest.mark.parametrize("size", [0, 1, 5, 4097, (3 << 20) + 3])
@pytest.mark.parametrize("parts", [1, 3, 8])
def test_results_are_split_over_parts_by_the_nodes_rule(shm_dir, rng, size, parts):
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    paths = tuple(str(shm_dir / f"out.{k}") for k in range(parts))
    # Kept from an earlier, larger call: written over in place, cut to size.
    for path in paths[::2]:
        Path(path).write_bytes(b"\xff" * (size + 9))
    write_result(paths, memoryview(data))
    pieces = [Path(p).read_bytes() for p in paths]
    assert b"".join(pieces) == data
    assert [len(p) for p in pieces] == [b - a for a, b in bulk_io.split(size, parts)]
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in paths[1::2])


@pytest.mark.parametrize("planted", ["link", "fifo", "hardlink", "dir"])
def test_a_result_part_is_never_written_through_or_into_a_stranger(shm_dir, tmp_path, planted):
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    out = shm_dir / "out.1"
    if planted == "link":
        out.symlink_to(target)
    elif planted == "fifo":
        os.mkfifo(out)
    elif planted == "hardlink":
        os.link(target, out)
    else:
        out.mkdir()
    paths = (str(shm_dir / "out.0"), str(out))
    outcome: dict[str, str | None] = {}
    writer = threading.Thread(target=lambda: outcome.update(reason=reason_of(write_result, paths, memoryview(b"result" * 99))),
                              daemon=True)
    writer.start()
    writer.join(5)
    assert not writer.is_alive(), "the writer blocked"
    assert outcome["reason"] == "shm_error"
    assert target.read_bytes() == b"keep me"


def test_through_the_port_parts_in_and_out(shm_dir, rng):
    """End to end: a request naming input parts and result parts, twice
    over the same (kept) files, with sizes that are not multiples of 4."""
    with start_port(KEM_SHM_DIR=str(shm_dir)) as port:
        for size, out_size in [(READ_LATE * 3 + 5, READ_LATE * 3 + 7), (READ_LATE + 2, 1001)]:
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            ins = write_parts(shm_dir, "slot.in", data, [size // 3, size // 2, 3 * size // 4])
            outs = [str(shm_dir / f"slot.out.{k}").encode() for k in range(4)]
            got = port.call("execute", b"double", (terms.atom("shm"), ins),
                            {"output_shm": outs, "output_size": out_size})
            assert terms.atom_name(got[0]) == "shm" and got[2] == out_size
            result = b"".join((shm_dir / f"slot.out.{k}").read_bytes() for k in range(4))
            assert result == reference.double(data, out_size)


def test_a_debug_call_reads_its_file_inputs(shm_dir, rng):
    """A debug call (docs/debug.md) runs apart from batches: its input,
    still in its file or parts, is read there too, and it is answered."""
    size = READ_LATE + 3
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    (shm_dir / "one.in").write_bytes(data)
    parts = write_parts(shm_dir, "dbg", data, [size // 2])
    with start_port(KEM_SHM_DIR=str(shm_dir)) as port:
        for value in (str(shm_dir / "one.in").encode(), parts):
            result, records = port.call("execute", b"double", (terms.atom("shm"), value),
                                        {"debug": True, "output_size": size}, timeout=60)
            assert terms.binary_bytes(result) == reference.double(data, size)
