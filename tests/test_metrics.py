"""The engine's own Prometheus series: what it counts in bulk is what counting one at a time gives."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from nerserve.service.metrics import Metrics, ResponseRecord, observe_each


def test_a_batchs_queue_times_land_in_the_buckets_one_observation_at_a_time_would() -> None:
    """observe_each counts a batch's values into the histogram's buckets at once: the exposition is
    the one the client library's own observe gives, value by value (bounds included)."""
    generator = random.Random(3)
    values = [generator.choice([0.0, 0.001, 0.01, 0.5, 20.0, float("inf")]) for _ in range(500)]
    values += [generator.random() * 3 for _ in range(500)]
    expositions = []
    for batched in (False, True):
        registry = CollectorRegistry()
        histogram = Histogram("queue", "q", ["model"], registry=registry, buckets=(0.001, 0.01, 0.1, 1, 10))
        child = histogram.labels("m")
        if batched:
            for first in range(0, len(values), 128):
                observe_each(child, values[first : first + 128])
        else:
            for value in values:
                child.observe(value)
        expositions.append([line for line in generate_latest(registry).decode().splitlines() if "_created" not in line])
    assert expositions[0] == expositions[1]
    assert 'queue_bucket{le="0.001",model="m"} 0.0' not in expositions[1]  # the bounds themselves counted


def test_a_workers_records_of_a_turn_count_as_each_record_alone_would() -> None:
    """record_responses (an HTTP worker's responses of one turn, in one message) gives every series
    the counts and latencies that recording the responses one by one gives."""
    generator = random.Random(5)
    records: list[ResponseRecord] = [
        (
            generator.choice(["span", "gner", ""]),
            generator.choice([200, 429, 503]),
            generator.choice([None, "team"]),
            generator.choice([None, generator.random()]),
        )
        for _ in range(2000)
    ]
    one_by_one, per_turn = Metrics(), Metrics()
    for record in records:
        one_by_one.record_response(*record)
    for first in range(0, len(records), 64):
        per_turn.record_responses(records[first : first + 64])

    def series(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in metrics.registry.collect()
            if family.name.startswith("nerserve_") and "request" in family.name
            for sample in family.samples
            if not sample.name.endswith("_created")
        }

    expected, got = series(one_by_one), series(per_turn)
    assert expected.keys() == got.keys() and len(expected) > 20
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key  # sums may round in another order
