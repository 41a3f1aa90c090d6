"""Open-loop arrival schedules, computed ahead of time so that slow responses cannot delay the
next request (the coordinated-omission trap of closed-loop testers)."""

from __future__ import annotations

import random


def arrivals(rate: float, duration: float, kind: str = "poisson", seed: int = 0) -> list[float]:
    """Send times in seconds from the start: constant spacing 1/rate, or Poisson (exponential gaps)."""
    if rate <= 0 or duration <= 0:
        return []
    if kind == "constant":
        count = int(rate * duration)
        return [i / rate for i in range(count)]
    if kind != "poisson":
        raise ValueError(f"unknown arrival process {kind!r}: poisson or constant")
    rng = random.Random(seed)
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def sweep_rates(start: float, stop: float, steps: int) -> list[float]:
    """Geometric series of rates, for locating the knee and the SLO-bound throughput."""
    if steps <= 1:
        return [start]
    ratio = (stop / start) ** (1 / (steps - 1))
    return [round(start * ratio**i, 2) for i in range(steps)]
