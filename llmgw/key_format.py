"""Gateway key format: ``llmg_`` + URL-safe random text; stored as a 12-char prefix and a SHA-256."""

from __future__ import annotations

import hashlib
import secrets

__all__ = [
    "KEY_MARKER",
    "PREFIX_LENGTH",
    "InvalidKeyFormat",
    "generate_key",
    "hash_key",
    "key_prefix",
    "validate_key_text",
]

KEY_MARKER = "llmg_"
PREFIX_LENGTH = 12
_MIN_LENGTH = 20
_MAX_LENGTH = 256
_RANDOM_BYTES = 32


class InvalidKeyFormat(ValueError):
    """A proposed key cannot be stored (too short, too long, or not printable ASCII)."""


def generate_key() -> str:
    return KEY_MARKER + secrets.token_urlsafe(_RANDOM_BYTES)


def key_prefix(key: str) -> str:
    return key[:PREFIX_LENGTH]


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def is_plausible_key(token: str) -> bool:
    """Cheap shape check before any lookup: printable ASCII without spaces, sane length."""
    return (
        _MIN_LENGTH <= len(token) <= _MAX_LENGTH
        and token.isascii()
        and token.isprintable()
        and (" " not in token)
    )


def validate_key_text(key: str) -> str:
    """Check a caller-chosen key (``keys create --key``) and return it."""
    if not is_plausible_key(key):
        raise InvalidKeyFormat(
            f"a key must be {_MIN_LENGTH}-{_MAX_LENGTH} printable ASCII characters without spaces"
        )
    return key
