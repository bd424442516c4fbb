"""Whole reads and writes on a descriptor, resuming after short ones:
frames on the pipe (wire/framing.py) and shared-memory files (shm.py)."""

from __future__ import annotations

import os


def read_into(fd: int, view: memoryview) -> int:
    """Fill view from fd; return how many bytes came (fewer only at EOF)."""
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            break
        got += n
    return got


def write_all(fd: int, views: list[memoryview]) -> None:
    """Write every byte of views, resuming after partial writes."""
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
