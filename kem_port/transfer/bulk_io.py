"""Bulk payloads between tmpfs files and memory, copied on several threads.

On the H100 host one thread copies 64 MB between a tmpfs file and memory
at ~4.5 GB/s (14 ms); eight threads, each its own range, at 27-31 GB/s
(2.1-2.5 ms; scripts/bench_bulk_floor and docs/benchmarks.md, "Bulk
copies"). The kernel does the copying inside read/write, which release the
GIL, so Python threads suffice. Writes into *one* tmpfs file serialize on
its inode lock (4 threads: 15.9 ms, no gain), so a result goes out as
separate part files, one per thread; reads of one file do run in parallel.

Everything here is read and written, never mmap'ed: a file that shrinks
under us is a short read and a clear error, never SIGBUS. Inputs are
opened as kem_port/shm.py checks them (no link followed, no wait on a FIFO,
a regular file only); a result part is written into a file only if it is
a regular file of ours with one link, or made anew.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from kem_port.errors import KemError, bad_args

THREADS = 8  # the copy rate stops growing past 8 on the H100 host (4: 14 GB/s, 8: 27 GB/s)
RANGE_MIN = 1 << 20  # below a MiB per thread, a thread's hand-off costs more than it saves

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()  # the reader and fetch threads may ask first at once: one pool, not two


def pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="kem-bulk")
    return _pool


def split(size: int, parts: int) -> list[tuple[int, int]]:
    """`parts` ranges [start, end) covering `size` bytes, all of one length
    but the last (some may be empty). The node splits a result with the
    same rule (kem_shm:split/2)."""
    step = -(-size // parts) if parts else 0
    return [(min(size, k * step), min(size, (k + 1) * step)) for k in range(parts)]


def run_all(tasks: Sequence[Callable[[], None]]) -> None:
    """Run tasks on the pool, wait for *every one* (a buffer they fill may
    be unmapped as soon as we return), then raise the first error."""
    if len(tasks) == 1:
        tasks[0]()
        return
    futures: list[Future] = [pool().submit(task) for task in tasks]
    wait(futures)
    for future in futures:
        future.result()


def open_input(path: str) -> tuple[int, int]:
    """(fd, size) of an input file, opened strictly; bad_args otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise bad_args(f"cannot open the shared-memory input: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise bad_args("the shared-memory input is not a regular file")
    return fd, info.st_size


def read_exactly(fd: int, view: memoryview, offset: int) -> None:
    """Fill view from fd at offset; bad_args if the file ends first."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise bad_args("shared-memory input shrank while being read")
        got += n


def read_file(fd: int, view: memoryview) -> None:
    """view filled from the start of one open file, on several threads."""
    ranges = split(len(view), max(1, min(THREADS, len(view) // RANGE_MIN)))
    run_all([lambda a=a, b=b: read_exactly(fd, view[a:b], a) for a, b in ranges if b > a])


def read_parts(parts: Sequence[tuple[str, int]], view: memoryview) -> None:
    """view filled with the files `parts` names, one after the other, each
    of the size it had when the request was checked; a thread a part."""
    tasks, offset = [], 0
    for path, size in parts:
        tasks.append(lambda p=path, v=view[offset : offset + size]: _read_part(p, v))
        offset += size
    run_all(tasks)


def _read_part(path: str, view: memoryview) -> None:
    fd, _ = open_input(path)
    try:
        read_exactly(fd, view, 0)
    finally:
        os.close(fd)


def write_parts(paths: Sequence[str], view: memoryview) -> None:
    """view split over `paths` (split/2's rule), a thread a part. Raises
    KemError shm_error when a part cannot be written."""
    ranges = split(len(view), len(paths))
    run_all([lambda p=p, a=a, b=b: _write_part(p, view[a:b]) for p, (a, b) in zip(paths, ranges)])


def _write_part(path: str, view: memoryview) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise KemError("shm_error", f"cannot write the result: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        # A file kept from an earlier call is written over in place (its
        # tmpfs pages already exist: 2.1 vs 11 ms for 64 MB in 8 parts).
        # Only a plain file of ours: not a FIFO or device that slipped past
        # O_NONBLOCK, not a hard link to a file elsewhere.
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
            raise KemError("shm_error", "a result file's name is taken by something else")
        written = 0
        while written < len(view):
            written += os.pwritev(fd, [view[written:]], written)
        os.ftruncate(fd, len(view))
    except OSError as exc:
        raise KemError("shm_error", f"cannot write the result: {exc.strerror}") from None
    finally:
        os.close(fd)
