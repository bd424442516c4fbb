"""Publishing a kernel: sign it as an ANS-104 item, check the item exactly
as a node's strict mode will, and post it to a bundler.

The check runs the node's own verifier (proofs.parse_item_header and
verify_item) on the bytes about to be sent, so an id printed by ``kem
publish`` is one that ``KEM_VERIFY=strict`` accepts once a gateway serves
the item. Bundlers take the item as the body of ``POST {url}/tx``
(``application/octet-stream``) and answer 200/201/202 with JSON holding the
id; a different id there is an error.
"""

from __future__ import annotations

import requests

from kem_port.arweave import ans104
from kem_port.arweave.proofs import ProofError, parse_item_header, verify_item
from kem_port.errors import KemError

DEFAULT_TAGS = (("Content-Type", "text/plain; charset=utf-8"), ("App-Name", "kem"), ("Kem-Kernel", "wgsl"))
POST_TIMEOUT = (10.0, 60.0)  # connect, read: seconds


def kernel_tags(extra: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """kem's default tags, each replaced by an extra tag of the same name."""
    names = {name for name, _ in extra}
    tags = [(n, v) for n, v in DEFAULT_TAGS if n not in names] + list(extra)
    return [(n.encode("utf-8"), v.encode("utf-8")) for n, v in tags]


def verify_built(item: ans104.BuiltItem) -> None:
    """The node's strict check, run on the item before it leaves."""
    try:
        parsed = parse_item_header(item.raw)
        verify_item(item.item_id, parsed, item.raw[parsed.data_offset :])
    except ProofError as exc:
        raise KemError("bad_item", f"the built item does not verify ({exc.reason}: {exc.detail})") from None


def post_item(bundler_url: str, item: ans104.BuiltItem) -> None:
    url = f"{bundler_url.rstrip('/')}/tx"
    try:
        resp = requests.post(
            url, data=item.raw, headers={"Content-Type": "application/octet-stream"}, timeout=POST_TIMEOUT
        )
    except requests.Timeout:
        raise KemError("timeout", f"POST {url} timed out") from None
    except requests.RequestException as exc:
        raise KemError("unreachable", f"POST {url}: {type(exc).__name__}") from None
    if resp.status_code not in (200, 201, 202):
        raise KemError("bundler_refused", f"POST {url} answered {resp.status_code}: {resp.text[:200].strip()}")
    try:
        answered = resp.json().get("id")
    except (ValueError, AttributeError):
        answered = None
    if answered is not None and answered != item.item_id:
        raise KemError("bundler_refused", f"the bundler answered id {answered}, not the item's {item.item_id}")
