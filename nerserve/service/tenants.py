"""Tenants: who is asking. API keys with a name each (the name is what logs, metrics and /stats
show; a key never is), a weight in the fair order and an optional ceiling on sentences per second.

Keys come as JSON, from NERSERVE_API_KEYS or the file NERSERVE_API_KEYS_FILE names (a mounted
Kubernetes secret): `{"team-a": "KEY", "team-b": {"key": "KEY", "weight": 2, "max_sentences_per_second": 50}}`.
No keys configured: every route is open, as before, and the start-up log says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, TypeAdapter

ANONYMOUS = ""  # the one tenant when no keys are configured
UNKNOWN = "unknown"  # the metrics label of a missing or wrong key (bounded cardinality)


class ApiKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: SecretStr = Field(min_length=16, description="the secret itself (at least 16 characters)")
    weight: float = Field(1.0, gt=0, description="share of the device against the other keys that wait")
    max_sentences_per_second: float | None = Field(None, gt=0, description="ceiling: above it this key alone gets 429")


KEYS = TypeAdapter(dict[str, ApiKey | SecretStr])


def parse_api_keys(text: str) -> dict[str, ApiKey]:
    """The JSON of NERSERVE_API_KEYS or its file: {name: key} or {name: {key, weight, ...}}."""
    parsed = KEYS.validate_python(json.loads(text))
    keys = {name: value if isinstance(value, ApiKey) else ApiKey(key=value) for name, value in parsed.items()}
    for name in keys:
        if not name or name == UNKNOWN or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"API key name {name!r}: letters, digits, '-' and '_' only, not {UNKNOWN!r}")
    secrets = [key.key.get_secret_value() for key in keys.values()]
    if len(set(secrets)) != len(secrets):
        raise ValueError("two API key names share one key")
    return keys


def read_api_keys(inline: SecretStr | None, path: Path | None) -> dict[str, ApiKey]:
    if inline is not None and path is not None:
        raise ValueError("API keys from NERSERVE_API_KEYS or NERSERVE_API_KEYS_FILE, not both")
    if path is not None:
        return parse_api_keys(path.read_text(encoding="utf-8"))
    return parse_api_keys(inline.get_secret_value()) if inline is not None else {}


@dataclass
class SentenceBucket:
    """A token bucket of sentences: `rate` a second, holding at most a second's worth (a burst of
    one request larger than that is let through when the bucket is full, then paid back)."""

    rate: float
    level: float = 0.0
    stamp: float = 0.0

    def charge(self, sentences: int, now: float) -> float:
        """0 when admitted (and charged); else the seconds until it would be."""
        self.level = min(self.rate, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= min(sentences, self.rate):
            self.level -= sentences
            return 0.0
        return (min(sentences, self.rate) - self.level) / self.rate


@dataclass
class Tenants:
    keys: dict[str, ApiKey] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        # compared as digests, every one of them each time: the time taken says nothing of which
        # key, or how much of one, matched
        self._digests = [(name, _digest(key.key.get_secret_value())) for name, key in self.keys.items()]
        self._buckets = {
            name: SentenceBucket(key.max_sentences_per_second, key.max_sentences_per_second, self.clock())
            for name, key in self.keys.items()
            if key.max_sentences_per_second is not None
        }

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def identify(self, authorization: str | None) -> str | None:
        """The key's name for an `Authorization: Bearer <key>` header, else None."""
        scheme, _, presented = (authorization or "").partition(" ")
        digest = _digest(presented.strip()) if scheme.lower() == "bearer" else b""
        found = None
        for name, expected in self._digests:
            if hmac.compare_digest(digest, expected):
                found = name
        return found

    def weight(self, tenant: str) -> float:
        key = self.keys.get(tenant)
        return key.weight if key is not None else 1.0

    def charge(self, tenant: str, sentences: int) -> float:
        """0 when the key is within its ceiling (and is charged); else its Retry-After in seconds."""
        bucket = self._buckets.get(tenant)
        return 0.0 if bucket is None else bucket.charge(sentences, self.clock())

    def names(self) -> list[str]:
        return list(self.keys)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
