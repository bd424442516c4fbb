"""Shared-memory transfers with the node, both directions, in one place.

For large payloads the node puts the input in a file in its shared-memory
directory (``KEM_SHM_DIR``, a tmpfs) and sends ``{shm, Path}``; it may also
name a file there for the result (``output_shm``). Paths must resolve
inside that directory and nowhere else.

Nothing there is taken on trust (docs/reliability.md, "Hostile callers and
a hostile host"): the directory must be what the node's kem_shm_dir makes
(a real directory of this user that no one else may enter) or transfers are
off; an input is opened without following links and without blocking, and
must be a regular file (a FIFO planted there would hang the reader, a device
would feed it without end); a result file is created exclusively, never
written over or through something already at that name.

From `shm_slot_threshold' (16 MiB) up the node sends a list of paths
instead of one, both ways: the payload split into parts, one file each, in
files it keeps from call to call (kem_shm_slots.erl). Each part is written
and read by its own thread or process (bulk_io.py): the copies run in
parallel and into tmpfs pages that already exist. Such a result part may
be written over, but only if it is a regular file of ours with one link.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from kem_port.errors import KemError, bad_args, too_large
from kem_port.transfer import bulk_io
from kem_port.transfer.fd_io import read_into, write_all
from kem_port.transfer.file_inputs import PACK_LIMIT, FileInput, FileParts

log = logging.getLogger("kem_port.shm")

# From this size an input stays in its file until its batch is encoded, and
# is then read straight into a mapped upload buffer (gpu/plan.py): on the
# H100 a 64 MB call's read-in and upload took 54 -> 12 ms that way
# (scripts/bench_bulk.py). Smaller ones are read now, to be packed.
READ_LATE = 4 * PACK_LIMIT
# Parts of one payload the node may name: it uses 8 (kem_shm_slots.erl).
MAX_PARTS = 64


class SharedMemory:
    def __init__(self, directory: Path | None, max_input_bytes: int) -> None:
        self.directory = private_directory(directory)
        self.max_input_bytes = max_input_bytes

    def path(self, value: bytes | list | None) -> str | tuple[str, ...]:
        """A file the node put in its shared-memory directory, and nowhere
        else; for a list of names (a payload in parts), each of them. A
        name is the bytes of the request's binary (wire/protocol.py reads
        the term), None for anything else."""
        if isinstance(value, list):
            if not 1 <= len(value) <= MAX_PARTS:
                raise bad_args(f"a shared-memory payload comes in 1 to {MAX_PARTS} parts")
            return tuple(self._one_path(part) for part in value)
        return self._one_path(value)

    def _one_path(self, raw: object) -> str:
        if self.directory is None or not isinstance(raw, bytes):
            raise bad_args("shared-memory transfer needs KEM_SHM_DIR and a binary path")
        if b"\0" in raw:
            # The OS cannot name such a file (realpath raised ValueError,
            # answered `internal`): a caller's mistake, and the path stays
            # out of the reply.
            raise bad_args("shared-memory path holds a NUL byte")
        path = os.path.realpath(raw.decode("utf-8", "replace"))
        if os.path.dirname(path) != str(self.directory):
            raise bad_args("shared-memory path is outside KEM_SHM_DIR")
        return path

    def read_input(self, value: bytes | list | None) -> memoryview | FileInput | FileParts:
        """The input file(s) `value` names, size-checked before reading:
        their bytes, or from READ_LATE up the files themselves, read at
        encoding."""
        path = self.path(value)
        if isinstance(path, tuple):
            return self._read_parts(path)
        fd, size = bulk_io.open_input(path)
        try:
            self._check_size(size)
            if size >= READ_LATE:
                return FileInput(path, size)
            # Read, not mmap: a mapped file truncated under us would kill the
            # port with SIGBUS; a read that comes up short is a clear error.
            view = memoryview(bytearray(size))
            if read_into(fd, view) < size:
                raise bad_args("shared-memory input shrank while being read")
            return view
        finally:
            os.close(fd)

    def _read_parts(self, paths: tuple[str, ...]) -> memoryview | FileParts:
        parts = []
        for path in paths:
            fd, size = bulk_io.open_input(path)
            os.close(fd)
            parts.append((path, size))
        found = FileParts(tuple(parts))
        self._check_size(found.size)
        if found.size >= READ_LATE:
            return found
        view = memoryview(bytearray(found.size))
        found.read_into(view)
        return view

    def _check_size(self, size: int) -> None:
        if size > self.max_input_bytes:
            raise too_large(f"input of {size} bytes is over KEM_MAX_INPUT_BYTES={self.max_input_bytes}")


def write_result(path: str | tuple[str, ...], view: memoryview) -> None:
    """The result into the file the node named (one copy from the mapped
    staging buffer into tmpfs), or split over the part files it named; the
    node deletes or keeps them. Raises KemError."""
    if isinstance(path, tuple):
        bulk_io.write_parts(path, view)
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            write_all(fd, [view])
        finally:
            os.close(fd)
    except OSError as exc:
        raise KemError("shm_error", f"cannot write the result: {exc.strerror}") from None


def private_directory(directory: Path | None) -> Path | None:
    """`directory` if it is a real directory of this user that no one else
    may enter (what the node's kem_shm_dir makes), else None: transfers
    are off and the node's payloads take the pipe."""
    if directory is None:
        return None
    try:
        info = os.lstat(directory)
    except OSError:
        info = None
    if info is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        log.warning("KEM_SHM_DIR is not a private directory of this user: shared-memory transfers are off")
        return None
    return directory
