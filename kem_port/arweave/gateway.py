"""Fetching a kernel and its proof from one gateway.

Only ``/tx/{id}`` (the signed L1 header), ``/raw/{id}`` (raw bytes, no
manifest resolution) and, for ANS-104 items, a ranged ``/raw/{root}`` read of
the whole item are used. Bodies are read raw: ``Accept-Encoding: identity``
is asked and no ``Content-Encoding`` is ever undone, so the bytes verified
are the bytes received. Sizes come from signed or declared lengths and are
checked against the cap *before* a body is downloaded.

Every request of one fetch shares one deadline (the store's overall fetch
budget): its timeouts shrink to the time left, and bodies are read a
socket read at a time with the deadline checked between reads, so a
gateway trickling a byte every 0.8 s is cut off (a per-read timeout alone
never fires on it). Headers are parsed strictly; whatever a gateway sends
that kem cannot use is that gateway's failure (the store tries the next).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import requests

from kem_port.errors import KemError
from kem_port.arweave.proofs import Proven, ProofError, parse_item_header, verify_item, verify_l1_data, verify_l1_header

HEADER_CAP = 64 * 1024
TRANSIENT = (requests.ConnectionError, requests.Timeout)
READ_CHUNK = 64 * 1024
_ROOT_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # goes into a URL path
_DECIMAL = re.compile(r"[0-9]{1,15}")  # int() also takes "1_0", " 7", "²"...


def header_int(value: str | None) -> int | None:
    """A non-negative decimal header value, or None when absent or junk."""
    if value is None or not _DECIMAL.fullmatch(value):
        return None
    return int(value)


def time_left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise GatewayError("timeout", "the fetch ran past its overall deadline")
    return left


class GatewayError(KemError):
    """One gateway failed for one kernel (HTTP, timeout or proof)."""


@dataclass(frozen=True)
class Fetched:
    data: bytes
    proven: Proven | None  # None when nothing was verified (pinned / off)
    gateway: str


class Gateway:
    def __init__(self, base_url: str, session: requests.Session, timeout_s: float, retries: int, cap: int) -> None:
        self.base = base_url.rstrip("/")
        self.session = session
        self.timeout = (min(timeout_s, 5.0), timeout_s)
        self.retries = retries
        self.cap = cap
        self.deadline = float("inf")  # set per fetch by the store (see for_fetch)

    def for_fetch(self, deadline: float) -> "Gateway":
        """A view of this gateway for one fetch, bounded by deadline."""
        view = Gateway.__new__(Gateway)
        view.__dict__.update(self.__dict__)
        view.deadline = deadline
        return view

    def _timeouts(self) -> tuple[float, float]:
        left = time_left(self.deadline)
        return (min(self.timeout[0], left), min(self.timeout[1], left))

    # -- HTTP with bounded retries ---------------------------------------

    def _get(self, path: str, headers: dict | None = None, method: str = "GET") -> requests.Response:
        url = f"{self.base}{path}"
        attempt = 0
        while True:
            # Within the fetch's deadline, itself within the call's (store.py);
            # raises once it has passed.
            timeouts = self._timeouts()
            try:
                resp = self.session.request(
                    method,
                    url,
                    headers={"Accept-Encoding": "identity", **(headers or {})},
                    timeout=timeouts,
                    stream=True,
                    allow_redirects=False,
                )
            except requests.Timeout:
                if attempt >= self.retries or self.deadline - time.monotonic() <= 0.01:
                    raise GatewayError("timeout", f"{method} {path}: no answer in {timeouts[1]:.1f} s") from None
            except requests.RequestException as exc:
                if attempt >= self.retries:
                    raise GatewayError("unreachable", f"{method} {path}: {type(exc).__name__}") from None
            else:
                if resp.status_code < 500 or attempt >= self.retries:
                    return resp
                resp.close()
            attempt += 1
            time.sleep(min(0.05 * (2**attempt), time_left(self.deadline)))

    def _read(self, resp: requests.Response, limit: int, what: str) -> bytes:
        """At most `limit` bytes of the raw body; more is an error, not a cut."""
        try:
            body = self._read_by_deadline(resp, limit + 1)
        except GatewayError:
            resp.close()
            raise
        except requests.RequestException as exc:
            raise GatewayError("timeout", f"reading {what}: {type(exc).__name__}") from None
        except Exception as exc:  # urllib3 read timeouts and resets
            raise GatewayError("timeout", f"reading {what}: {type(exc).__name__}") from None
        finally:
            resp.close()
        if len(body) > limit:
            raise GatewayError("too_large", f"{what} is larger than {limit} bytes")
        return body

    def _read_by_deadline(self, resp: requests.Response, limit: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < limit:
            time_left(self.deadline)
            chunk = resp.raw.read1(min(READ_CHUNK, limit - got), decode_content=False)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    # -- the proof paths --------------------------------------------------

    def fetch_verified(self, kernel_id: str) -> Fetched:
        resp = self._get(f"/tx/{kernel_id}")
        if resp.status_code in (200, 202):
            try:
                header = json.loads(self._read(resp, HEADER_CAP, "transaction header"))
            except ValueError:
                raise GatewayError("header_unavailable", "/tx answer is not JSON (pending or garbled)") from None
            return self._fetch_l1(kernel_id, header)
        resp.close()
        if resp.status_code == 404:
            return self._fetch_item(kernel_id)
        raise GatewayError("http_error", f"/tx/{kernel_id} answered {resp.status_code}")

    def _fetch_l1(self, kernel_id: str, header: object) -> Fetched:
        proven = _proof(lambda: verify_l1_header(kernel_id, header))
        if proven.data_size > self.cap:
            raise GatewayError("too_large", f"signed data_size {proven.data_size} is over the {self.cap}-byte kernel cap")
        if proven.inline_data is not None:
            return Fetched(proven.inline_data, proven, self.base)
        data = self.fetch_raw(kernel_id, expected=proven.data_size)
        _proof(lambda: verify_l1_data(proven, data))
        return Fetched(data, proven, self.base)

    def _fetch_item(self, kernel_id: str) -> Fetched:
        head = self._get(f"/raw/{kernel_id}", method="HEAD")
        head.close()
        if head.status_code == 404:
            raise GatewayError("not_found", f"{kernel_id} is neither a transaction nor a data item here")
        if head.status_code != 200:
            raise GatewayError("http_error", f"HEAD /raw/{kernel_id} answered {head.status_code}")
        root = head.headers.get("X-AR-IO-Root-Transaction-Id")
        start = header_int(head.headers.get("X-AR-IO-Root-Data-Item-Offset"))
        payload_start = header_int(head.headers.get("X-AR-IO-Root-Data-Offset"))
        item_size = header_int(head.headers.get("X-AR-IO-Data-Item-Size"))
        if start is None or payload_start is None or item_size is None:
            raise GatewayError("header_unavailable", "no usable X-AR-IO-Root-* offsets for this data item")
        if not root or not _ROOT_ID.fullmatch(root):
            raise GatewayError("header_unavailable", "no valid root transaction id for this data item")
        if start < 0 or item_size <= 0 or not start < payload_start <= start + item_size:
            raise GatewayError("header_unavailable", "inconsistent data item offsets")
        if item_size - (payload_start - start) > self.cap:
            raise GatewayError("too_large", f"item payload is over the {self.cap}-byte kernel cap")
        if item_size > self.cap + 8192:
            raise GatewayError("too_large", "item header is implausibly large")
        resp = self._get(f"/raw/{root}", headers={"Range": f"bytes={start}-{start + item_size - 1}"})
        if resp.status_code != 206:
            resp.close()
            raise GatewayError("http_error", f"ranged /raw/{root} answered {resp.status_code}, not 206")
        buf = self._read(resp, item_size, "data item")
        if len(buf) != item_size:
            raise GatewayError("size_mismatch", f"item is {len(buf)} bytes, offsets say {item_size}")
        item = _proof(lambda: parse_item_header(buf))
        payload = buf[item.data_offset :]
        proven = _proof(lambda: verify_item(kernel_id, item, payload))
        return Fetched(payload, proven, self.base)

    def fetch_raw(self, kernel_id: str, expected: int | None = None) -> bytes:
        resp = self._get(f"/raw/{kernel_id}")
        if resp.status_code == 404:
            resp.close()
            raise GatewayError("not_found", f"/raw/{kernel_id} answered 404")
        if resp.status_code != 200:
            resp.close()
            raise GatewayError("http_error", f"/raw/{kernel_id} answered {resp.status_code}")
        declared = resp.headers.get("Content-Length")
        if declared is not None and header_int(declared) is None:
            resp.close()
            raise GatewayError("bad_response", "unusable Content-Length")
        if declared is not None:
            if int(declared) > self.cap:
                resp.close()
                raise GatewayError("too_large", f"Content-Length {declared} is over the {self.cap}-byte kernel cap")
            if expected is not None and int(declared) != expected:
                resp.close()
                raise GatewayError("size_mismatch", f"Content-Length {declared}, signed data_size {expected}")
        data = self._read(resp, self.cap, "kernel body")
        if expected is not None and len(data) != expected:
            raise GatewayError("size_mismatch", f"got {len(data)} bytes, signed data_size {expected}")
        return data


def _proof(check):
    try:
        return check()
    except ProofError as exc:
        raise GatewayError(exc.reason, exc.detail) from None
