"""Verified kernels on disk, one file per ID, written atomically.

Each file is one JSON metadata line (id, sha256, tier, owner, origin) and
then the bytes. Writes go to a temporary file in the same directory and are
renamed into place, so concurrent ports and crashes never leave a torn
entry. Every load re-hashes the bytes; a file that does not match its own
metadata is deleted and reported as corrupt.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheEntry:
    data: bytes
    sha256: str
    tier: str
    owner: str
    origin: str


class CorruptEntry(Exception):
    pass


class KernelCache:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, kernel_id: str) -> Path:
        return self.directory / f"{kernel_id}.kem"

    def load(self, kernel_id: str) -> CacheEntry | None:
        path = self._path(kernel_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return None
        try:
            head, _, data = raw.partition(b"\n")
            meta = json.loads(head)
            if meta.get("id") != kernel_id or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
                raise CorruptEntry(kernel_id)
            return CacheEntry(data, meta["sha256"], str(meta.get("tier", "")), str(meta.get("owner", "")), str(meta.get("origin", "")))
        except (ValueError, KeyError, CorruptEntry):
            try:
                path.unlink()
            except OSError:
                pass
            raise CorruptEntry(kernel_id) from None

    def store(self, kernel_id: str, entry: CacheEntry) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = {"id": kernel_id, "sha256": entry.sha256, "tier": entry.tier, "owner": entry.owner, "origin": entry.origin}
        fd, tmp = tempfile.mkstemp(prefix=f".{kernel_id}.", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(json.dumps(meta, sort_keys=True).encode() + b"\n")
                out.write(entry.data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self._path(kernel_id))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def load_pins(path: Path | None) -> dict[str, str]:
    """Lines of ``<id> <sha256-hex>``; blank lines and ``#`` comments ignored."""
    if path is None:
        return {}
    pins: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[1]) != 64:
            raise SystemExit(f"kem_port: {path}:{number}: expected '<id> <sha256-hex>'")
        pins[parts[0]] = parts[1].lower()
    return pins
