"""Architecture configs ↔ manifest dicts (stdlib only)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def config_from_dict(cls: type[T], values: dict[str, Any], decode: type[Any]) -> T:
    """A frozen config dataclass from its manifest dict: labels as a tuple, `decode` rebuilt,
    unknown keys refused (a manifest from another version fails loudly, not half-read)."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {sorted(unknown)}")
    values = dict(values)
    values["labels"] = tuple(values["labels"])
    values["decode"] = decode(**values.get("decode", {}))
    return cls(**values)


def open_label_config_dict(config: Any) -> dict[str, Any]:
    """An open-label config's manifest dict: its labels and its options' label list as lists."""
    from dataclasses import asdict

    values = asdict(config)
    values["labels"] = list(config.labels)
    values["decode"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in values["decode"].items()}
    return values


def open_label_config_from_dict(cls: type[T], values: dict[str, Any], decode: type[Any]) -> T:
    """config_from_dict with the options' label list (a request-level field) back as a tuple."""
    values = dict(values)
    options = dict(values.get("decode", {}))
    options["labels"] = tuple(options.get("labels", ()))
    values["decode"] = options
    return config_from_dict(cls, values, decode)
