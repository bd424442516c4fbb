"""Arweave wallets (RSA JWK files) for signing what kem publishes.

An Arweave wallet is a 4096-bit RSA key with e = 65537 written as a JSON Web
Key; its address is base64url(SHA-256(n)), the same owner address strict
verification reports (proofs.owner_address).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa

from kem_port.arweave.ids import BadEncoding, b64url_decode, b64url_encode
from kem_port.arweave.proofs import RSA_E, owner_address
from kem_port.errors import KemError

KEY_BITS = 4096
OWNER_BYTES = KEY_BITS // 8  # ANS-104 signature type 1: a 512-byte owner


def generate() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=RSA_E, key_size=KEY_BITS)


def owner(key: rsa.RSAPrivateKey) -> bytes:
    """The owner field: the modulus n, big-endian, 512 bytes."""
    return key.public_key().public_numbers().n.to_bytes(OWNER_BYTES, "big")


def address(key: rsa.RSAPrivateKey) -> str:
    return owner_address(owner(key))


def _int(jwk: dict, name: str) -> int:
    value = jwk.get(name)
    if not isinstance(value, str):
        raise KemError("bad_wallet", f"the JWK has no {name!r}")
    try:
        return int.from_bytes(b64url_decode(value), "big")
    except BadEncoding:
        raise KemError("bad_wallet", f"the JWK's {name!r} is not base64url") from None


def load_jwk(path: Path) -> rsa.RSAPrivateKey:
    """A private key from an Arweave JWK file; p/q are recovered if absent."""
    try:
        jwk = json.loads(path.read_text())
    except OSError as exc:
        raise KemError("bad_wallet", f"cannot read {path}: {exc.strerror}") from None
    except ValueError:
        raise KemError("bad_wallet", f"{path} is not JSON") from None
    if not isinstance(jwk, dict) or jwk.get("kty") != "RSA":
        raise KemError("bad_wallet", f"{path} is not an RSA JWK (kty must be RSA)")
    n, e, d = _int(jwk, "n"), _int(jwk, "e"), _int(jwk, "d")
    if e != RSA_E or n.bit_length() != KEY_BITS:
        raise KemError("bad_wallet", f"an Arweave wallet is a {KEY_BITS}-bit RSA key with e={RSA_E}; this is {n.bit_length()}-bit, e={e}")
    if all(k in jwk for k in ("p", "q", "dp", "dq", "qi")):
        p, q = _int(jwk, "p"), _int(jwk, "q")
        dp, dq, qi = _int(jwk, "dp"), _int(jwk, "dq"), _int(jwk, "qi")
    else:
        p, q = rsa.rsa_recover_prime_factors(n, e, d)
        dp, dq, qi = rsa.rsa_crt_dmp1(d, p), rsa.rsa_crt_dmq1(d, q), rsa.rsa_crt_iqmp(p, q)
    try:
        return rsa.RSAPrivateNumbers(p, q, d, dp, dq, qi, rsa.RSAPublicNumbers(e, n)).private_key()
    except ValueError as exc:
        raise KemError("bad_wallet", f"the JWK's numbers do not form an RSA key: {exc}") from None


def to_jwk(key: rsa.RSAPrivateKey) -> dict:
    numbers = key.private_numbers()
    public = numbers.public_numbers

    def enc(value: int) -> str:
        return b64url_encode(value.to_bytes((value.bit_length() + 7) // 8, "big"))

    return {
        "kty": "RSA", "e": enc(public.e), "n": enc(public.n), "d": enc(numbers.d),
        "p": enc(numbers.p), "q": enc(numbers.q), "dp": enc(numbers.dmp1), "dq": enc(numbers.dmq1), "qi": enc(numbers.iqmp),
    }


def save_jwk(key: rsa.RSAPrivateKey, path: Path) -> None:
    """Write the wallet readable by its owner only; never over an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(to_jwk(key), fh)
