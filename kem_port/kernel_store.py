"""Where kernel source comes from: local directories first, then a remote seam.

A :class:`KernelResolver` asks its local stores (the operator's
``KEM_KERNEL_DIR``, then the examples packaged in ``kem_port/kernels``)
without touching the network; only if none has the id does the router hand
it, on a worker thread, to the remote store (Arweave, see arweave/).
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kem_port.errors import KemError
from kem_port.gpu.wgsl.wgsl_canonical import canonical

PACKAGED_KERNELS = Path(__file__).resolve().parent / "kernels"


@dataclass(frozen=True)
class KernelSource:
    kernel_id: str
    text: str  # the canonical text (gpu/wgsl_canonical.py): what kem analyses and compiles
    sha256: str  # of the bytes as published (the Arweave id's content, the refusal store's key)
    origin: str  # where it came from: a path, or gateway URL
    tier: str  # how it was admitted: "local", "strict", "pinned", "off", ...
    # None: text is the kernel's own (gpu/pipelines.py compiles its gas form);
    # True/False: text is already its gas form (admission made it), metered or not.
    metered: bool | None = None


def source_from_bytes(kernel_id: str, data: bytes, origin: str, tier: str) -> KernelSource:
    """The one door kernel text comes in by (directories, Arweave, api.py
    and the CLI): from here on kem holds only the canonical text, so the
    analyses, the rewrites and naga read one program (issue 24). Done once
    a load: stores keep the result (0.02 ms for a 2 KB kernel, ~10 ms for
    1 MiB, best of 5 on the 2-core dev machine; tests/test_wgsl_canonical.py)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KemError("bad_kernel", f"kernel {kernel_id} is not UTF-8 text: {exc}") from None
    try:
        text = canonical(text)
    except KemError as exc:
        raise KemError(exc.reason, f"kernel {kernel_id}: {exc.detail}") from None
    return KernelSource(kernel_id, text, hashlib.sha256(data).hexdigest(), origin, tier)


class RemoteStore(Protocol):
    def accepts(self, kernel_id: str) -> bool: ...

    def cached(self, kernel_id: str) -> KernelSource | None: ...

    def fetch(self, kernel_id: str, deadline: float | None = None) -> KernelSource: ...

    def describe(self) -> dict: ...


class DirectoryStore:
    """``<dir>/<id>.wgsl`` is kernel ``<id>``; re-read only when the file changes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prefix = os.path.join(str(directory), "")
        # A refused file is remembered too: not re-read and re-lexed each call.
        self._cache: dict[str, tuple[int, KernelSource | KemError]] = {}
        self._lock = threading.Lock()

    def lookup(self, kernel_id: str) -> KernelSource | None:
        # kernel_id is already restricted to [A-Za-z0-9_-]: no separators, no
        # "..", so the path cannot leave the directory.
        # A plain string path: pathlib cost ~6 us of a ~30 us frame here.
        path = f"{self._prefix}{kernel_id}.wgsl"
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None
        # No lock to read: a dict get is one step under the GIL and writers
        # store whole (mtime, source) tuples (a lock here was ~0.3 us of
        # every call, on the reader).
        hit = self._cache.get(kernel_id)
        if hit is None or hit[0] != mtime:
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                return None
            hit = (mtime, _source_or_refusal(kernel_id, data, path))
            with self._lock:
                self._cache[kernel_id] = hit
        if isinstance(hit[1], KemError):
            raise KemError(hit[1].reason, hit[1].detail)  # a fresh one: a re-raised object grows its traceback
        return hit[1]


def _source_or_refusal(kernel_id: str, data: bytes, path: str) -> KernelSource | KemError:
    try:
        return source_from_bytes(kernel_id, data, path, "local")
    except KemError as exc:
        return exc


class KernelResolver:
    def __init__(self, local: list[DirectoryStore], remote: RemoteStore | None = None) -> None:
        self.local = local
        self.remote = remote

    def resolve_local(self, kernel_id: str) -> KernelSource | None:
        """Local directories, then the remote store's verified cache; no network."""
        for store in self.local:
            found = store.lookup(kernel_id)
            if found is not None:
                return found
        if self.remote is not None and self.remote.accepts(kernel_id):
            return self.remote.cached(kernel_id)
        return None

    def needs_fetch(self, kernel_id: str) -> bool:
        return self.remote is not None and self.remote.accepts(kernel_id)

    def fetch(self, kernel_id: str, deadline: float | None = None) -> KernelSource:
        """Fetch from the remote store, by ``deadline`` (``time.monotonic()``) if given."""
        if self.remote is None or not self.remote.accepts(kernel_id):
            raise KemError("kernel_not_found", f"no kernel {kernel_id!r} on this node")
        return self.remote.fetch(kernel_id, deadline)

    def describe_local(self) -> str:
        return ", ".join(str(s.directory) for s in self.local)


def default_stores(kernel_dir: Path | None) -> list[DirectoryStore]:
    stores = [DirectoryStore(kernel_dir)] if kernel_dir else []
    stores.append(DirectoryStore(PACKAGED_KERNELS))
    return stores
