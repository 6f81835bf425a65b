"""Password hashing: Argon2id through pwdlib, with the scrypt hashes of earlier versions still
accepted and upgraded at the next successful login.

New hashes are Argon2id at OWASP's recommended minimum (19 MiB, 2 passes, 1 lane: ~50 ms on
this project's 2-core machines, where the library default of 64 MiB x 3 x 4 lanes took ~200 ms
of both cores per login), in the standard `$argon2id$...` format. `verify_and_update` tells the
caller when a hash should be replaced (an old scrypt one, or Argon2 parameters that changed).
Unknown users are checked against DUMMY_HASH so that a wrong username costs the same time as a
wrong password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from pwdlib import PasswordHash
from pwdlib.exceptions import UnknownHashError
from pwdlib.hashers.argon2 import Argon2Hasher
from pwdlib.hashers.base import ensure_bytes, ensure_str


class LegacyScryptHasher:
    """Verifies the `scrypt$n$r$p$salt_b64$hash_b64` hashes mega-py wrote before Argon2.

    It never writes one: `PasswordHash` rehashes with Argon2 whenever one of these verifies."""

    PREFIX = "scrypt$"

    @classmethod
    def identify(cls, hash: str | bytes) -> bool:
        return ensure_str(hash).startswith(cls.PREFIX)

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        raise NotImplementedError("scrypt hashes are read, never written; Argon2 writes")

    def verify(self, password: str | bytes, hash: str | bytes) -> bool:
        try:
            _, n, r, p, salt, expected = ensure_str(hash).split("$")
            digest = hashlib.scrypt(
                ensure_bytes(password),
                salt=base64.b64decode(salt),
                n=int(n),
                r=int(r),
                p=int(p),
                dklen=len(base64.b64decode(expected)),
                maxmem=64 * 1024 * 1024,
            )
        except (ValueError, TypeError):
            return False
        return hmac.compare_digest(digest, base64.b64decode(expected))

    def check_needs_rehash(self, hash: str | bytes) -> bool:
        return True


# Argon2id cost: memory in KiB, passes, lanes (OWASP Password Storage Cheat Sheet, 2023).
ARGON2_MEMORY_KIB = 19 * 1024
ARGON2_PASSES = 2
ARGON2_LANES = 1
# The first hasher writes; every one of them can verify.
PASSWORDS = PasswordHash(
    (
        Argon2Hasher(
            time_cost=ARGON2_PASSES, memory_cost=ARGON2_MEMORY_KIB, parallelism=ARGON2_LANES
        ),
        LegacyScryptHasher(),
    )
)


def hash_password(password: str) -> str:
    return PASSWORDS.hash(password)


def verify_password(password: str, encoded: str) -> bool:
    return verify_and_update(password, encoded)[0]


def verify_and_update(password: str, encoded: str) -> tuple[bool, str | None]:
    """(matches, new hash to store or None). A hash in no known format never matches."""
    try:
        return PASSWORDS.verify_and_update(password, encoded)
    except UnknownHashError:
        return False, None


DUMMY_HASH = hash_password("mega-dummy-password-for-unknown-users")
