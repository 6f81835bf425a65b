"""Password hashing with scrypt (memory-hard, in the standard library).

Format: `scrypt$n$r$p$salt_b64$hash_b64`. `verify` compares in constant time. Unknown users are
checked against DUMMY_HASH so that a wrong username costs the same time as a wrong password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

# 2**14 x 8 x 128 bytes = 16 MiB per hash and ~50 ms here: costly to brute-force, cheap to log in.
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
KEY_BYTES = 32


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return "$".join(
        ["scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(salt), _b64(digest)]
    )


def verify_password(password: str, encoded: str) -> bool:
    try:
        scheme, n, r, p, salt, expected = encoded.split("$")
        if scheme != "scrypt":
            return False
        digest = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(digest, base64.b64decode(expected))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=KEY_BYTES, maxmem=64 * 1024 * 1024
    )


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


DUMMY_HASH = hash_password(secrets.token_urlsafe(16))
