"""The architectures the project serves: one registration line each (design layer 2, no torch).

Everything else — the command line's architecture choice, loading, tuning, export, the service and
the tests — reads the registered specs (ner.archs.base.ArchitectureSpec).
"""

from __future__ import annotations

from typing import Any

from nerserve.ner.archs import bartner, diffusion, gliner, gner, nag, setgen, span
from nerserve.ner.archs.base import ArchitectureSpec

REGISTERED = (span.SPEC, nag.SPEC, diffusion.SPEC, setgen.SPEC, bartner.SPEC, gner.SPEC, gliner.SPEC)
ARCHITECTURES: dict[str, ArchitectureSpec[Any, Any]] = {spec.name: spec for spec in REGISTERED}


def architecture(name: str) -> ArchitectureSpec[Any, Any]:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}") from None
