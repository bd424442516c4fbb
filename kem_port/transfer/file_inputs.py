"""An input that stays in the node's shared-memory file(s) until its
batch is encoded, and the size from which one does."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kem_port.transfer import bulk_io

PACK_LIMIT = 256 * 1024  # inputs up to this size are packed into one upload (gpu/plan.py)


@dataclass(frozen=True)
class FileInput:
    """An input still in the node's shared-memory file, read when its batch
    is encoded: straight into a write-mapped upload buffer where the hot
    path has one (one host copy instead of two; docs/executor.md, "Large
    payloads"). Read, never mmap'ed: a file that shrinks under us gives a
    short read and a clear error, not SIGBUS."""

    path: str
    size: int  # checked against the limits when the request was parsed

    def __len__(self) -> int:
        return self.size

    def read_into(self, view: memoryview) -> None:
        """Fill view[:size] from the file, on several threads (bulk_io);
        bad_args if it is shorter now."""
        # Opened as kem_port/shm.py opens it: no link followed, no wait on
        # a FIFO, and only a regular file is read.
        fd, _ = bulk_io.open_input(self.path)
        try:
            bulk_io.read_file(fd, view[: self.size])
        finally:
            os.close(fd)


@dataclass(frozen=True)
class FileParts:
    """An input the node wrote as several part files (kem_shm's kept slots,
    from `shm_slot_threshold' up), one after the other: written and read
    a thread a part, as one file cannot be written in parallel. Read like
    FileInput: straight into the upload buffer, never mmap'ed."""

    parts: tuple[tuple[str, int], ...]  # (path, size) as checked at parsing

    @property
    def size(self) -> int:
        return sum(size for _, size in self.parts)

    def __len__(self) -> int:
        return self.size

    def read_into(self, view: memoryview) -> None:
        """Fill view[:size] from the parts; bad_args if one is shorter now."""
        bulk_io.read_parts(self.parts, view[: self.size])


FILE_INPUTS = (FileInput, FileParts)
