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

from pydantic import BaseModel, ConfigDict, Field, SecretStr, TypeAdapter, ValidationError, field_validator

ANONYMOUS = ""  # the one tenant when no keys are configured
UNKNOWN = "unknown"  # the metrics label of a missing or wrong key (bounded cardinality)


MIN_KEY_LENGTH = 16


class ApiKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: SecretStr = Field(description=f"the secret itself (at least {MIN_KEY_LENGTH} characters)")
    weight: float = Field(1.0, gt=0, description="share of the device against the other keys that wait")
    max_sentences_per_second: float | None = Field(None, gt=0, description="ceiling: above it this key alone gets 429")

    @field_validator("key")
    @classmethod
    def _long_enough(cls, key: SecretStr) -> SecretStr:
        if len(key.get_secret_value()) < MIN_KEY_LENGTH:
            raise ValueError(f"a key needs at least {MIN_KEY_LENGTH} characters")
        return key


KEYS = TypeAdapter(dict[str, ApiKey])


class ApiKeysError(ValueError):
    """API keys that cannot be read, said without any key in the message."""


def parse_api_keys(text: str) -> dict[str, ApiKey]:
    """The JSON of NERSERVE_API_KEYS or its file: {name: key} or {name: {key, weight, ...}}."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as error:  # its message names a place, never the text
        raise ApiKeysError(f"not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    if not isinstance(given, dict):
        raise ApiKeysError('a JSON object of names, {"team-a": "KEY", "team-b": {"key": "KEY", "weight": 2}}')
    for name, value in given.items():
        if not isinstance(value, str | dict):
            raise ApiKeysError(f"{name}: a key, or an object {{key, weight, max_sentences_per_second}}")
    try:  # a name's plain key is its object's key
        keys = KEYS.validate_python({name: {"key": v} if isinstance(v, str) else v for name, v in given.items()})
    except ValidationError as error:
        raise ApiKeysError(_without_keys(error)) from None
    for name in keys:
        if not name or name == UNKNOWN or not name.replace("-", "").replace("_", "").isalnum():
            raise ApiKeysError(f"API key name {name!r}: letters, digits, '-' and '_' only, not {UNKNOWN!r}")
    secrets = [key.key.get_secret_value() for key in keys.values()]
    if len(set(secrets)) != len(secrets):
        raise ApiKeysError("two API key names share one key")
    return keys


def _without_keys(error: ValidationError) -> str:
    """A validation error's first problem, where it is and what, without the value (a key, maybe)."""
    first = error.errors(include_input=False, include_url=False)[0]
    place = ".".join(str(part) for part in first["loc"])
    return f"{place}: {first['msg'].removeprefix('Value error, ')}"


def read_api_keys(inline: SecretStr | None, path: Path | None) -> dict[str, ApiKey]:
    """The API keys configured, or ApiKeysError saying what is wrong and where (the variable or file)."""
    if inline is not None and path is not None:
        raise ApiKeysError("API keys from NERSERVE_API_KEYS or NERSERVE_API_KEYS_FILE, not both")
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ApiKeysError(f"NERSERVE_API_KEYS_FILE {path}: cannot be read ({error})") from None
        return _from("NERSERVE_API_KEYS_FILE", text)
    return _from("NERSERVE_API_KEYS", inline.get_secret_value()) if inline is not None else {}


def _from(source: str, text: str) -> dict[str, ApiKey]:
    try:
        return parse_api_keys(text)
    except ApiKeysError as error:
        raise ApiKeysError(f"{source}: {error}") from None


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
