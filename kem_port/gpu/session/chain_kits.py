"""The chain kits of one device (chain_kit.py), by request shape.

KITS shapes are kept, least recently used first out. A batch of stateless
chains of one shape (chain_batch.py) needs a kit a run: the shape's, then
replicas, REPLICAS at most, each planned from the shape's first chain.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kem_port.gpu.session.chain_kit import ChainKit
from kem_port.gpu.session.sessions import Session

KITS = 32  # request shapes kept: at most ~KITS x 3 x 64 KiB of buffers
REPLICAS = 64  # extra kits of stateless shapes, for batches of one shape: ~12 MiB at most


class ChainKits:
    """The kits of one device, by request shape, least recently used first out."""

    def __init__(self) -> None:
        self._kits: OrderedDict[tuple, ChainKit] = OrderedDict()
        self._replicas: OrderedDict[tuple, ChainKit] = OrderedDict()  # (key, n): a batch's n-th extra run of a shape

    def replica(self, key: tuple, n: int, make: Callable[[], ChainKit | None]) -> ChainKit | None:
        """The n-th extra kit of a shape, made by `make` when none is kept
        (None: it cannot be); REPLICAS kept at most."""
        found = self._replicas.get((key, n))
        if found is None:
            found = make()
            if found is None:
                return None
            self._replicas[(key, n)] = found
            while len(self._replicas) > REPLICAS:
                self._replicas.popitem(last=False)[1].retire()
        self._replicas.move_to_end((key, n))
        return found

    def __len__(self) -> int:
        return len(self._kits)

    def get(self, key: tuple) -> ChainKit | None:
        return self._kits.get(key)

    def keep(self, key: tuple, kit: ChainKit) -> None:
        old = self._kits.pop(key, None)
        if old is not None:
            old.retire()
        self._kits[key] = kit
        while len(self._kits) > KITS:
            self._kits.popitem(last=False)[1].retire()

    def used(self, key: tuple) -> None:
        self._kits.move_to_end(key)

    def drop(self, key: tuple) -> None:
        kit = self._kits.pop(key, None)
        if kit is not None:
            kit.retire()
        for name in [name for name in self._replicas if name[0] == key]:
            self._replicas.pop(name).retire()

    def forget(self, session: Session) -> None:
        """A closed session's kits (they hold its buffers' bind groups)."""
        for key in [k for k, kit in self._kits.items() if kit.session is session]:
            self.drop(key)

    def clear(self) -> None:
        kits, self._kits = self._kits, OrderedDict()
        replicas, self._replicas = self._replicas, OrderedDict()
        for kit in (*kits.values(), *replicas.values()):
            kit.retire()
