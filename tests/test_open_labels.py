"""The committed label-matching model (gliner-open) through a real server: it says it takes open
labels, needs a label list, reads names it was never trained on, splits a long list over passes,
finds nested entities when asked, and a per-request threshold moves what comes back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serving import Server

MODEL = "gliner-open"
SENTENCE = ["Peter", "Blackburn", "flew", "from", "Paris", "to", "Berlin", "."]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    instance = Server(models=MODEL, default_model=MODEL)
    try:
        instance.wait_ready()
        yield instance
    finally:
        instance.stop()


def extract(server: Server, **payload: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/extract", json={"model": MODEL, **payload}, timeout=60)


def found(response: httpx.Response) -> set[tuple[str, str]]:
    assert response.status_code == 200, response.text
    return {(e["text"], e["type"]) for e in response.json()["results"][0]["entities"]}


def test_models_says_open_labels_and_its_options(server: Server) -> None:
    listed = next(m for m in httpx.get(f"{server.url}/models").json()["models"] if m["name"] == MODEL)
    assert listed["capabilities"]["open_labels"] and listed["capabilities"]["nested"]
    assert set(listed["options"]) == {"threshold", "nested"}


def test_the_label_list_is_required_and_bounded(server: Server) -> None:
    missing = extract(server, tokens=[SENTENCE])
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "labels"
    too_many = extract(server, tokens=[SENTENCE], labels=[f"type {i}" for i in range(101)])
    assert too_many.status_code == 422 and too_many.json()["error"]["field"] == "labels"
    bad = extract(server, tokens=[SENTENCE], labels=["person"], options={"threshold": 1.5})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "options.threshold"
    for name in (" ", "person (PER)"):  # the rule said in words, not as the schema's pattern
        refused = extract(server, tokens=[SENTENCE], labels=["city", name]).json()["error"]
        assert refused["field"] == "labels[1]"
        assert refused["message"] == "labels[1]: a label name needs a character other than white space, and no '(' or ')'"


def test_it_finds_what_it_is_asked_for_by_name(server: Server) -> None:
    asked = found(extract(server, tokens=[SENTENCE], labels=["person", "city"]))
    assert ("Peter Blackburn", "person") in asked and ("Paris", "city") in asked
    only_people = found(extract(server, tokens=[SENTENCE], labels=["person"]))
    assert only_people and {t for _, t in only_people} == {"person"}


def test_a_long_label_list_runs_in_passes_and_answers_within_it(server: Server) -> None:
    names = ["person", "city", *(f"category {i}" for i in range(58))]  # three passes of the encoder
    asked = found(extract(server, tokens=[SENTENCE], labels=names))
    assert ("Peter Blackburn", "person") in asked and {t for _, t in asked} <= set(names)


def test_threshold_and_nesting_per_request(server: Server) -> None:
    loose = found(extract(server, tokens=[SENTENCE], labels=["person", "city"], options={"threshold": 0.05}))
    strict = found(extract(server, tokens=[SENTENCE], labels=["person", "city"], options={"threshold": 0.99}))
    assert strict <= loose and len(strict) < len(loose)
    text = ["The", "University", "of", "Texas", "at", "Austin", "admitted", "her", "."]
    nested = extract(server, tokens=[text], labels=["organization", "location"], options={"nested": True, "threshold": 0.3})
    flat = extract(server, tokens=[text], labels=["organization", "location"], options={"threshold": 0.3})
    assert found(flat) <= found(nested)
