"""API keys: a JSON key file of named keys, stored as sha256 digests, each with optional rate limits.

`llmfleet keys add|list|revoke` writes the file (atomically, mode 0600); every gateway reads it through
LLMFLEET_KEYS_FILE and picks up changes within a second, so a revoked key is refused (401) without a restart.
A presented key is hashed and compared against every stored digest in constant time; only the key's name
ever appears in logs and metrics.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

KEY_PREFIX = "sk-llmfleet-"
RELOAD_EVERY_S = 1.0


class KeyFileError(Exception):
    """The key file cannot be read or written, or a command names a key that is not there."""


@dataclass(frozen=True)
class KeyRecord:
    """One named key: its sha256 digest and its limits (0 = unlimited)."""

    name: str
    digest: str
    rpm: int = 0  # requests per minute
    tpm: int = 0  # tokens (prompt + completion) per minute
    created: float = 0.0
    weight: float = 1.0  # its share of a priority class against other keys' (fair shares, gateway/http/tenants.py)


current_key: contextvars.ContextVar[KeyRecord | None] = contextvars.ContextVar("current_key", default=None)


def digest_of(key: str) -> str:
    """The stored form of a key: its sha256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def default_path() -> Path:
    """$LLMFLEET_KEYS_FILE, else ~/.config/llmfleet/keys.json."""
    configured = os.environ.get("LLMFLEET_KEYS_FILE")
    return Path(configured).expanduser() if configured else Path.home() / ".config" / "llmfleet" / "keys.json"


def load(path: Path) -> list[KeyRecord]:
    """Every record of a key file (an absent file has none)."""
    if not path.exists():
        return []
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return [KeyRecord(**item) for item in raw["keys"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KeyFileError(f"{path}: not a readable key file ({type(exc).__name__}: {exc})") from None


def save(path: Path, records: list[KeyRecord]) -> None:
    """Write the key file atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"keys": [asdict(r) for r in records]}, out, indent=2)
    tmp.replace(path)


def add(path: Path, name: str, *, rpm: int = 0, tpm: int = 0, weight: float = 1.0) -> str:
    """Create a key named `name`; returns the key itself (shown once, never stored)."""
    records = load(path)
    if any(r.name == name for r in records):
        raise KeyFileError(f"a key named {name!r} already exists (revoke it first)")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    if not weight > 0:
        raise KeyFileError(f"a key's weight must be > 0, not {weight}")
    save(path, [*records, KeyRecord(name, digest_of(key), rpm, tpm, time.time(), weight)])
    return key


def revoke(path: Path, name: str) -> None:
    """Remove the key named `name`."""
    records = load(path)
    if not any(r.name == name for r in records):
        raise KeyFileError(f"no key named {name!r} in {path}")
    save(path, [r for r in records if r.name != name])


class KeyStore:
    """The keys a gateway accepts: the key file (re-read when it changes) plus the legacy single key."""

    def __init__(self, path: Path | None, legacy_key: str | None = None) -> None:
        self.path = path
        self._legacy = None if legacy_key is None else KeyRecord("default", digest_of(legacy_key))
        self._records: list[KeyRecord] = []
        self._stamp: tuple[float, int] | None = None
        self._checked = 0.0
        self._refresh(force=True)

    @property
    def enabled(self) -> bool:
        """Whether requests need a key at all."""
        return self._legacy is not None or self.path is not None

    def lookup(self, presented: str) -> KeyRecord | None:
        """The record of a presented key, or None; every stored digest is compared, in constant time."""
        self._refresh()
        wanted = digest_of(presented).encode()
        found = None
        for record in ([self._legacy] if self._legacy else []) + self._records:
            if hmac.compare_digest(wanted, record.digest.encode()):
                found = record
        return found

    def _refresh(self, *, force: bool = False) -> None:
        """Re-read the key file when its mtime or size changed (checked at most once a second)."""
        now = time.monotonic()
        if self.path is None or (not force and now - self._checked < RELOAD_EVERY_S):
            return
        self._checked = now
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime, stat.st_size)
        except FileNotFoundError:
            stamp = None
        if force or stamp != self._stamp:
            self._records = load(self.path) if stamp is not None else []
            self._stamp = stamp
