"""Exact percentiles and summaries of latency samples (no sampling, no histogram error)."""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(latencies: Sequence[float]) -> dict[str, float]:
    """Latency percentiles in milliseconds, plus mean and max."""
    result = {f"p{q:g}": percentile(latencies, q) * 1000 for q in PERCENTILES}
    result["mean"] = (sum(latencies) / len(latencies) * 1000) if latencies else math.nan
    result["max"] = max(latencies) * 1000 if latencies else math.nan
    return result


def is_stable(values: Sequence[float], tolerance: float = 0.02, window: int = 3) -> bool:
    """The last `window` values agree within `tolerance` (relative to their mean)."""
    if len(values) < window:
        return False
    tail = values[-window:]
    mean = sum(tail) / window
    return mean > 0 and (max(tail) - min(tail)) / mean <= tolerance
