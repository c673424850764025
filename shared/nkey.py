"""NATS nkeys for user identities: a fresh seed, and the public key of a seed.

Why here, in the standard library only: `python3 -m shared.auth init` must
make a deployment's keys on a bare host (the Compose and Swarm demos run it
with the system python). The encoding is NATS's (base32 of a prefix byte,
the 32 key bytes and a CRC-16); the Ed25519 public key comes from PyNaCl
when it is installed, else from the RFC 8032 arithmetic below, done once per
key. Signing the server's nonce is the bus's, through nats-py and PyNaCl.
"""

from __future__ import annotations

import base64
import hashlib
import secrets


class NkeyError(ValueError):
    """Text that is not the nkey it should be."""


_PREFIX_SEED = 18 << 3
_PREFIX_USER = 20 << 3


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM, the checksum of an encoded nkey."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(raw: bytes) -> str:
    raw += _crc16(raw).to_bytes(2, "little")
    return base64.b32encode(raw).decode().rstrip("=")


def _decode(text: str) -> bytes:
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except ValueError:
        raise NkeyError("not an nkey (bad base32)") from None
    if len(raw) < 3 or _crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        raise NkeyError("not an nkey (bad checksum)")
    return raw[:-2]


def _ed25519_public(seed: bytes) -> bytes:
    """The Ed25519 public key of a 32-byte seed (RFC 8032, 5.1.5)."""
    try:
        from nacl.signing import SigningKey
    except ImportError:
        pass
    else:
        return bytes(SigningKey(seed).verify_key)
    q = 2**255 - 19
    d = -121665 * pow(121666, q - 2, q) % q
    by = 4 * pow(5, q - 2, q) % q
    xx = (by * by - 1) * pow(d * by * by + 1, q - 2, q) % q
    bx = pow(xx, (q + 3) // 8, q)
    if (bx * bx - xx) % q:
        bx = bx * pow(2, (q - 1) // 4, q) % q
    if bx % 2:
        bx = q - bx

    def add(p1: tuple[int, int, int, int], p2: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        x1, y1, z1, t1 = p1
        x2, y2, z2, t2 = p2
        a, b = (y1 - x1) * (y2 - x2) % q, (y1 + x1) * (y2 + x2) % q
        c, dd = t1 * 2 * d * t2 % q, z1 * 2 * z2 % q
        e, f, g, h = b - a, dd - c, dd + c, b + a
        return e * f % q, g * h % q, f * g % q, e * h % q

    h = hashlib.sha512(seed).digest()
    scalar = (int.from_bytes(h[:32], "little") & ((1 << 254) - 8)) | (1 << 254)
    acc, point = (0, 1, 1, 0), (bx, by, 1, bx * by % q)
    while scalar:
        if scalar & 1:
            acc = add(acc, point)
        point = add(point, point)
        scalar >>= 1
    zi = pow(acc[2], q - 2, q)
    x, y = acc[0] * zi % q, acc[1] * zi % q
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def new_user_seed() -> str:
    """A fresh nkey user seed (`SU...`), from the OS's random source."""
    raw = secrets.token_bytes(32)
    return _encode(bytes([_PREFIX_SEED | (_PREFIX_USER >> 5), (_PREFIX_USER & 31) << 3]) + raw)


def public_key(seed: str) -> str:
    """The public nkey (`U...`) of a user seed; NkeyError if it is not one."""
    raw = _decode(seed)
    if len(raw) != 34 or raw[0] & 0xF8 != _PREFIX_SEED or (((raw[0] & 7) << 5) | (raw[1] >> 3)) != _PREFIX_USER:
        raise NkeyError("not an nkey user seed")
    return _encode(bytes([_PREFIX_USER]) + _ed25519_public(raw[2:]))
