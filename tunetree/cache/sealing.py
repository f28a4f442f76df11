"""How an entry's manifest travels to the remote: a sealed envelope, signed when a key is set.

The envelope is three header lines and the manifest exactly as the local cache stores it
(its sha256 line, then the JSON)::

    tunetree-remote-entry 1
    key <the entry's key>
    hmac-sha256 <hex> | unsigned
    <manifest bytes>

The HMAC (SHA-256, keyed by ``$TUNETREE_CACHE_KEY``) covers the first two lines and the
manifest, so a signed entry cannot be moved under another key or altered. With a key set,
an unsigned envelope, or one signed with another key, is refused: a writer without the key
cannot poison the fleet. Without a key no envelope can be checked, signed or not, so the
remote tier reads none unless unsigned records are trusted explicitly
(``$TUNETREE_CACHE_TRUST_UNSIGNED``, :func:`trust_unsigned_from_env`). The manifest's
artifacts are named by their sha256, so the signature covers them too. Nothing here parses
the manifest's JSON; the local store does.

Other records travel in the same envelope under their own first line (``magic``): an
auto-tune depth decision (:mod:`.decisions`) is ``tunetree-depth-decision 1``, so one kind
of record can never be taken for the other, signed or not.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from .entry import EntryFault

KEY_ENV = "TUNETREE_CACHE_KEY"
"""Environment variable holding the fleet's shared secret (any string)."""

TRUST_UNSIGNED_ENV = "TUNETREE_CACHE_TRUST_UNSIGNED"
"""Environment variable: ``1`` lets a host without the key read unsigned remote records."""

MAGIC = b"tunetree-remote-entry 1"
UNSIGNED = b"unsigned"


class ForgedEntryError(EntryFault):
    """An envelope whose signature is missing or wrong while a key is set."""


def secret_from_env() -> bytes | None:
    """The shared secret from ``$TUNETREE_CACHE_KEY`` (None when unset or empty)."""
    value = os.environ.get(KEY_ENV, "")
    return value.encode() if value else None


def trust_unsigned_from_env() -> bool:
    """Whether ``$TUNETREE_CACHE_TRUST_UNSIGNED`` is ``1``, ``true`` or ``yes``."""
    return os.environ.get(TRUST_UNSIGNED_ENV, "").strip().lower() in ("1", "true", "yes")


def why_unreadable(secret: bytes | None, trust_unsigned: bool) -> str | None:
    """Why remote records are not read with this key and trust (None when they are)."""
    if secret is not None or trust_unsigned:
        return None
    return (
        f"{KEY_ENV} is not set, so no record can be checked for the fleet's signature; set "
        f"the fleet's key, or {TRUST_UNSIGNED_ENV}=1 (trust_unsigned=True) to read unsigned "
        "records from a bucket only trusted writers can change"
    )


def _mac(secret: bytes, key: str, manifest: bytes, magic: bytes) -> str:
    message = magic + b"\nkey " + key.encode() + b"\n" + manifest
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def seal(key: str, manifest: bytes, secret: bytes | None, magic: bytes = MAGIC) -> bytes:
    """The envelope of ``manifest`` for ``key``, signed when ``secret`` is given."""
    signature = _mac(secret, key, manifest, magic).encode() if secret else UNSIGNED
    return magic + b"\nkey " + key.encode() + b"\nhmac-sha256 " + signature + b"\n" + manifest


def unseal(data: bytes, key: str, secret: bytes | None, magic: bytes = MAGIC) -> tuple[bytes, bool]:
    """The manifest bytes inside an envelope for ``key``, and whether it was signed.

    EntryFault when the envelope is malformed, of another kind (``magic``) or made for another
    key; :class:`ForgedEntryError` when a key is set and the signature is missing or wrong.
    """
    parts = data.split(b"\n", 3)
    if len(parts) != 4 or parts[0] != magic:
        raise EntryFault("the record is not a tunetree envelope of its kind (or another version)")
    if parts[1] != b"key " + key.encode():
        raise EntryFault("the record was made for another key")
    if not parts[2].startswith(b"hmac-sha256 "):
        raise EntryFault("the record's signature line is malformed")
    signature, manifest = parts[2][len(b"hmac-sha256 ") :], parts[3]
    signed = signature != UNSIGNED
    if secret is None:
        return manifest, signed
    if not signed:
        raise ForgedEntryError(f"the record is unsigned while {KEY_ENV} is set")
    if not hmac.compare_digest(signature, _mac(secret, key, manifest, magic).encode()):
        raise ForgedEntryError(f"the record's signature does not match {KEY_ENV}")
    return manifest, signed
