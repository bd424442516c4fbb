"""Inputs still in their shared-memory file (gpu/calls.FileInput) are read
when their batch is encoded: into a write-mapped upload buffer on the C-API
path, into memory then write_buffer on wgpu-py's objects. Both match numpy;
a file that shrank is that caller's clear error, and the others in its batch
are answered."""

from __future__ import annotations

import os

import numpy as np
import pytest

import reference
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.gpu.calls import KernelCall
from kem_port.transfer.file_inputs import FileInput
from kem_port.gpu.executor import Executor
from kem_port.transfer.shm import READ_LATE, SharedMemory
from kem_port.wire import terms
from kem_port.stats import Stats
from executor_helpers import run_double


@pytest.fixture(scope="module", params=["native", "wrappers"])
def executor(request):
    ex = Executor(Config(hot_path=request.param), Stats())
    ex.open()
    return ex


def test_file_inputs_of_several_sizes_match_numpy(executor, tmp_path, rng):
    calls, expected = [], []
    for k, size in enumerate([READ_LATE, READ_LATE + 3, 3 * READ_LATE + 1]):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        path = tmp_path / f"in{k}"
        path.write_bytes(data)
        out = size + (k - 1) * 4
        calls.append(KernelCall("double", FileInput(str(path), size), out))
        expected.append(reference.double(data, out))
    small = rng.integers(0, 256, 100, dtype=np.uint8).tobytes()
    calls.append(KernelCall("double", small, 100))
    expected.append(reference.double(small, 100))
    for _ in range(2):  # again: the pooled upload buffers are mapped anew
        assert run_double(executor, calls) == expected


def test_a_file_that_shrank_fails_alone_with_a_clear_error(executor, tmp_path, rng):
    data = rng.integers(0, 256, 2 * READ_LATE, dtype=np.uint8).tobytes()
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_bytes(data)
    bad.write_bytes(data)
    calls = [KernelCall("double", FileInput(str(bad), len(data)), 64), KernelCall("double", FileInput(str(good), len(data)), 64)]
    os.truncate(bad, READ_LATE)  # after the request was checked, before the batch reads it
    first, second = run_double(executor, calls)
    assert isinstance(first, KemError) and first.reason == "bad_args" and "shrank" in first.detail
    assert second == reference.double(data, 64)


def test_the_shm_reader_leaves_large_inputs_in_their_file(tmp_path):
    memory = SharedMemory(tmp_path.resolve(), 1 << 30)
    (tmp_path / "small").write_bytes(b"x" * 100)
    (tmp_path / "large").write_bytes(b"y" * READ_LATE)
    assert bytes(memory.read_input(str(tmp_path / "small").encode())) == b"x" * 100
    late = memory.read_input(str(tmp_path / "large").encode())
    assert isinstance(late, FileInput) and len(late) == READ_LATE
