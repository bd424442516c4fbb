"""The port's side of the shared-memory channel against a hostile host:
what another user (or a bug) may leave in the node's directory is refused,
never followed, never blocking the reader. The node's side is eunit's
kem_shm_tests; docs/reliability.md lists both."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import start_port
from kem_port.wire import terms
from kem_port.client import PortError
from kem_port.transfer.shm import SharedMemory, private_directory, write_result
from executor_helpers import reason_of


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "kem-test"
    directory.mkdir(mode=0o700)
    return directory


def test_a_fifo_at_the_input_path_is_refused_at_once(shm_dir):
    """Opening a FIFO for reading waits for a writer: without O_NONBLOCK
    the port's reader thread would hang there for good."""
    fifo = shm_dir / "1.in"
    os.mkfifo(fifo)
    memory = SharedMemory(shm_dir, 1 << 20)
    outcome: dict[str, str | None] = {}
    reader = threading.Thread(target=lambda: outcome.update(reason=reason_of(memory.read_input, str(fifo).encode())),
                              daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "the reader blocked on a FIFO"
    assert outcome["reason"] == "bad_args"


def test_a_fifo_swapped_in_before_a_late_read_is_refused_at_once(shm_dir):
    """Large inputs are read at encoding, by path (gpu/calls.py FileInput):
    that second open must not block the GPU thread on a FIFO either."""
    from kem_port.transfer.file_inputs import FileInput

    fifo = shm_dir / "9.in"
    os.mkfifo(fifo)
    late = FileInput(str(fifo), 16)
    outcome: dict[str, str | None] = {}
    reader = threading.Thread(target=lambda: outcome.update(reason=reason_of(late.read_into, memoryview(bytearray(16)))),
                              daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "the late read blocked on a FIFO"
    assert outcome["reason"] == "bad_args"


def test_a_device_or_directory_at_the_input_path_is_refused(shm_dir):
    memory = SharedMemory(shm_dir, 1 << 20)
    (shm_dir / "sub.in").mkdir()
    assert reason_of(memory.read_input, str(shm_dir / "sub.in").encode()) == "bad_args"
    if os.geteuid() == 0:  # only root may make a device node
        os.mknod(shm_dir / "zero.in", 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero: endless bytes
        assert reason_of(memory.read_input, str(shm_dir / "zero.in").encode()) == "bad_args"


def test_a_link_at_the_input_path_is_not_followed(shm_dir, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for the port")
    (shm_dir / "1.in").symlink_to(secret)
    memory = SharedMemory(shm_dir, 1 << 20)
    assert reason_of(memory.read_input, str(shm_dir / "1.in").encode()) == "bad_args"


@pytest.mark.parametrize("planted", ["file", "link", "fifo"])
def test_a_result_file_is_never_written_over_or_through(shm_dir, tmp_path, planted):
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    out = shm_dir / "1.out"
    if planted == "file":
        out.write_bytes(b"keep me")
    elif planted == "link":
        out.symlink_to(target)
    else:
        os.mkfifo(out)
    assert reason_of(write_result, str(out), memoryview(b"result")) == "shm_error"
    assert target.read_bytes() == b"keep me"
    if planted == "file":
        assert out.read_bytes() == b"keep me"


def test_a_result_file_is_made_private(shm_dir):
    out = shm_dir / "1.out"
    write_result(str(out), memoryview(b"result"))
    assert out.read_bytes() == b"result"
    assert out.stat().st_mode & 0o777 == 0o600


def test_only_a_private_directory_of_ours_is_used(tmp_path, shm_dir):
    assert private_directory(shm_dir) == shm_dir
    open_dir = tmp_path / "kem-open"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    link = tmp_path / "kem-link"
    link.symlink_to(shm_dir)
    for refused in (open_dir, link, tmp_path / "missing", None):
        assert private_directory(refused) is None
    assert SharedMemory(open_dir, 1 << 20).directory is None


def test_through_the_port_a_planted_fifo_leaves_the_reader_serving(shm_dir, rng):
    """End to end: the port answers the FIFO with bad_args and the next
    call, through a real file, is right."""
    os.mkfifo(shm_dir / "2.in")
    data = rng.integers(0, 256, 70_001, dtype=np.uint8).tobytes()
    (shm_dir / "3.in").write_bytes(data)
    with start_port(KEM_SHM_DIR=str(shm_dir)) as port:
        with pytest.raises(PortError) as err:
            port.call("execute", b"double", (terms.atom("shm"), str(shm_dir / "2.in").encode()), {})
        assert err.value.reason == "bad_args"
        got = port.call("execute", b"double", (terms.atom("shm"), str(shm_dir / "3.in").encode()), {})
        assert got == __import__("reference").double(data, len(data))


def test_a_nul_byte_in_a_shared_memory_path_is_bad_args(shm_dir, rng):
    """A path with a NUL byte (in an input, a part list or output_shm) is
    the caller's mistake, answered bad_args without echoing the path; it
    was `internal` (os.path.realpath's ValueError), issue 24."""
    data = rng.integers(0, 256, 70_001, dtype=np.uint8).tobytes()
    (shm_dir / "4.in").write_bytes(data)
    good = str(shm_dir / "4.in").encode()
    hostile = str(shm_dir).encode() + b"/4.in\x00/../../etc/passwd"
    shm = lambda path: (terms.atom("shm"), path)  # noqa: E731
    with start_port(KEM_SHM_DIR=str(shm_dir)) as port:
        attempts = [
            (shm(hostile), {}),
            (shm([good, hostile]), {}),
            (shm(good), {terms.atom("output_shm"): hostile}),
        ]
        for source, opts in attempts:
            with pytest.raises(PortError) as err:
                port.call("execute", b"double", source, opts)
            assert err.value.reason == "bad_args"
            assert "NUL" in err.value.detail and str(shm_dir) not in err.value.detail
        for size in (4, 70_001):
            chunk = data[:size]
            (shm_dir / f"{size}.in").write_bytes(chunk)
            got = port.call("execute", b"double", shm(str(shm_dir / f"{size}.in").encode()), {})
            assert got == __import__("reference").double(chunk, len(chunk))
