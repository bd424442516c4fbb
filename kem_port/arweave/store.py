"""Kernels by Arweave ID: verified cache first, then each gateway in turn.

Policy (``KEM_VERIFY``):

* ``strict`` (default): the bytes must be proven to be the data signed under
  the ID (proofs.py); with ``KEM_ALLOWED_OWNERS`` the signer must be listed.
* ``pinned``: only IDs in ``KEM_PINS``, and only bytes with the pinned
  SHA-256, fetched or cached; nothing else runs.
* ``strict+pinned``: pinned IDs must match their pin, all others are strict.
* ``off``: bytes as served, with a warning on every fetch. Development only.

Nothing that failed a check is cached or run. A kernel is fetched once per
node (disk cache) and read once per process (memory); concurrent first calls
for one ID share one fetch.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import requests

from kem_port.arweave import budget
from kem_port.arweave.cache import CacheEntry, CorruptEntry, KernelCache, load_pins
from kem_port.arweave.gateway import Gateway, GatewayError
from kem_port.arweave.ids import is_arweave_id
from kem_port.config import Config
from kem_port.errors import KemError
from kem_port.kernel_store import KernelSource, source_from_bytes
from kem_port.stats import Stats

log = logging.getLogger("kem_port.arweave")
MEMORY_ENTRIES = 1024
BUSY_WAIT_S = 1.0  # how long a fetch waits for a busy gateway before trying the next
VERIFIED_TIERS = ("strict", "strict+pinned")


class ArweaveStore:
    def __init__(self, config: Config, stats: Stats) -> None:
        self.config = config
        self.stats = stats
        self.policy = config.verify
        self.owners = frozenset(config.allowed_owners)
        self.pins = load_pins(config.pins_file)
        self.cache = KernelCache(config.cache_dir) if config.cache_dir else None
        session = requests.Session()
        session.trust_env = False  # no proxy or netrc surprises between us and the gateway
        self.gateways = [
            Gateway(url, session, config.fetch_timeout_s, config.fetch_retries, config.max_kernel_bytes)
            for url in config.gateways
        ]
        # Per gateway, at most this many fetches at once: a gateway that
        # hangs holds its own slots, never every fetch thread (the store
        # moves on to the next gateway when a slot is not free in time).
        self._slots = [threading.BoundedSemaphore(config.gateway_concurrency) for _ in self.gateways]
        self._memory: OrderedDict[str, KernelSource] = OrderedDict()
        # Proven kernels the lexer refused (kernel_store.source_from_bytes),
        # by id: an Arweave id names immutable bytes, so the refusal holds
        # for good, and without this every repeat of a refused id was a new
        # gateway fetch (an amplifier any caller could drive).
        self._refused: OrderedDict[str, KemError] = OrderedDict()
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()

    # -- RemoteStore protocol ---------------------------------------------

    def accepts(self, kernel_id: str) -> bool:
        return is_arweave_id(kernel_id)

    def cached(self, kernel_id: str) -> KernelSource | None:
        with self._lock:
            hit = self._memory.get(kernel_id)
            if hit is not None:
                self._memory.move_to_end(kernel_id)
        if hit is not None:
            self.stats.inc("arweave_cache_hits")
            return hit
        entry = self._load_disk(kernel_id)
        if entry is None:
            return None
        source = source_from_bytes(kernel_id, entry.data, entry.origin, entry.tier)
        self._remember(source)
        self.stats.inc("arweave_cache_hits")
        self.stats.inc("arweave_disk_hits")
        return source

    def fetch(self, kernel_id: str, deadline: float | None = None) -> KernelSource:
        """The kernel from the cache or the gateways, by ``deadline``
        (``time.monotonic()``; budget.py) when one is given."""
        with self._lock:
            flight = self._inflight.get(kernel_id)
            leader = flight is None
            if leader:
                flight = self._inflight[kernel_id] = Future()
        if not leader:
            self.stats.inc("arweave_shared_fetches")
            return _follow(flight, kernel_id, deadline)
        try:
            refused = self._refused.get(kernel_id)
            if refused is not None:
                raise KemError(refused.reason, refused.detail)
            with budget.within(deadline):
                source = self.cached(kernel_id) or self._fetch_from_gateways(kernel_id)
            flight.set_result(source)
            return source
        except BaseException as exc:
            flight.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(kernel_id, None)

    def describe(self) -> dict:
        return {
            # Counts, not URLs or paths: this reaches adapter_info's callers.
            "gateways": len(self.gateways),
            "verify": self.policy,
            "allowed_owners": sorted(self.owners),
            "pins": len(self.pins),
            "disk_cache": self.config.cache_dir is not None,
            "max_kernel_bytes": self.config.max_kernel_bytes,
        }

    def describe_stats(self) -> dict:
        with self._lock:
            return {"arweave_memory_entries": len(self._memory)}

    # -- admission ----------------------------------------------------------

    def _admissible(self, kernel_id: str, sha256: str, tier: str, owner: str) -> bool:
        pin = self.pins.get(kernel_id)
        if self.policy == "off":
            return True
        if self.policy == "pinned" or (self.policy == "strict+pinned" and pin):
            return pin is not None and sha256 == pin
        return tier in VERIFIED_TIERS and (not self.owners or owner in self.owners)

    def _load_disk(self, kernel_id: str) -> CacheEntry | None:
        if self.cache is None:
            return None
        try:
            entry = self.cache.load(kernel_id)
        except CorruptEntry:
            log.warning("cache entry for %s did not match its hash; discarded", kernel_id)
            self.stats.inc("arweave_cache_corrupt")
            return None
        if entry is None or not self._admissible(kernel_id, entry.sha256, entry.tier, entry.owner):
            return None
        return entry

    def _remember(self, source: KernelSource) -> None:
        with self._lock:
            self._memory[source.kernel_id] = source
            while len(self._memory) > MEMORY_ENTRIES:
                self._memory.popitem(last=False)

    # -- fetching -------------------------------------------------------------

    def _fetch_from_gateways(self, kernel_id: str) -> KernelSource:
        if self.policy == "pinned" and kernel_id not in self.pins:
            self.stats.rejection("not_pinned")
            raise KemError("not_pinned", f"{kernel_id} has no pin in KEM_PINS and KEM_VERIFY=pinned")
        outcomes: list[tuple[int, GatewayError]] = []
        deadline = time.monotonic() + self.config.fetch_deadline_s
        call_left = budget.left()  # the call's own deadline, less time to answer (budget.py)
        if call_left is not None:
            deadline = min(deadline, time.monotonic() + call_left)
        for number, (gateway, slots) in enumerate(zip(self.gateways, self._slots), start=1):
            try:
                # Each gateway gets its attempts' worth of time, all within the
                # fetch's overall deadline: a trickling one is cut off and
                # the next still has time.
                own = min(deadline, time.monotonic() + self.config.fetch_timeout_s * (self.config.fetch_retries + 1))
                data, tier, owner = self._fetch_bounded(gateway.for_fetch(own), slots, kernel_id, own)
            except GatewayError as exc:
                self.stats.rejection(exc.reason)
                log.warning("gateway %s: %s: %s", gateway.base, kernel_id, exc)
                outcomes.append((number, exc))
                continue
            source = self._source_of(kernel_id, data, number, tier)
            self.stats.inc("arweave_fetches")
            self.stats.inc("arweave_fetch_bytes", len(data))
            if self.cache is not None:
                try:
                    self.cache.store(kernel_id, CacheEntry(data, source.sha256, tier, owner, gateway.base))
                except OSError as exc:
                    log.warning("could not cache %s: %s", kernel_id, exc)
            self._remember(source)
            return source
        raise _combined_error(kernel_id, outcomes)

    def _source_of(self, kernel_id: str, data: bytes, number: int, tier: str) -> KernelSource:
        """The kernel's source, or its refusal remembered where the bytes are
        proven (a gateway under KEM_VERIFY=off could lie to get an id refused)."""
        try:
            return source_from_bytes(kernel_id, data, f"gateway #{number}", tier)
        except KemError as refused:
            if tier in VERIFIED_TIERS:
                with self._lock:
                    self._refused[kernel_id] = refused
                    while len(self._refused) > MEMORY_ENTRIES:
                        self._refused.popitem(last=False)
            raise

    def _fetch_bounded(self, gateway: Gateway, slots: threading.BoundedSemaphore, kernel_id: str, deadline: float) -> tuple[bytes, str, str]:
        """One gateway's attempt, within its concurrency and the deadline;
        anything unexpected from it is its failure, not the caller's."""
        if not slots.acquire(timeout=max(0.0, min(deadline - time.monotonic(), BUSY_WAIT_S))):
            raise GatewayError("busy", "too many fetches in progress at this gateway")
        try:
            return self._fetch_one(gateway, kernel_id)
        except GatewayError:
            raise
        except Exception as exc:
            log.warning("gateway %s answered %s junk kem cannot use: %r", gateway.base, kernel_id, exc)
            raise GatewayError("bad_response", "an answer kem cannot use") from None
        finally:
            slots.release()

    def _fetch_one(self, gateway: Gateway, kernel_id: str) -> tuple[bytes, str, str]:
        pin = self.pins.get(kernel_id)
        if self.policy == "off":
            data = gateway.fetch_raw(kernel_id)
            log.warning("KEM_VERIFY=off: running %s from %s UNVERIFIED", kernel_id, gateway.base)
            return data, "off", ""
        if self.policy == "pinned":
            data = gateway.fetch_raw(kernel_id)
            _check_pin(data, pin)
            return data, "pinned", ""
        fetched = gateway.fetch_verified(kernel_id)
        owner = fetched.proven.owner_address if fetched.proven else ""
        if self.owners and owner not in self.owners:
            raise GatewayError("owner_not_allowed", f"signed by {owner}, not in KEM_ALLOWED_OWNERS")
        if pin is not None:
            _check_pin(fetched.data, pin)
            return fetched.data, "strict+pinned", owner
        return fetched.data, "strict", owner


def _follow(flight: Future, kernel_id: str, deadline: float | None) -> KernelSource:
    """Wait for another call's fetch of the same kernel, up to our deadline."""
    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        return flight.result(timeout=wait)
    except FutureTimeout:
        raise KemError("timeout", f"{kernel_id}: another call's fetch of it did not finish before this call's deadline") from None


def _check_pin(data: bytes, pin: str | None) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if pin is None or digest != pin:
        raise GatewayError("pin_mismatch", f"SHA-256 {digest[:16]}... is not the pinned one")


def _combined_error(kernel_id: str, outcomes: list[tuple[int, GatewayError]]) -> KemError:
    """One error naming each gateway by its number: URLs stay in the log."""
    reasons = {exc.reason for _, exc in outcomes}
    reason = reasons.pop() if len(reasons) == 1 else "fetch_failed"
    detail = "; ".join(f"gateway #{number}: {exc.reason} ({exc.detail})" for number, exc in outcomes) or "no gateways configured"
    return KemError(reason, f"{kernel_id}: {detail}")
