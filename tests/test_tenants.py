"""Tenants: API keys at the door, fair shares by key in the queue, ceilings per key, metrics by key
name (never a key) — units on their own, then a real server started with the keys the Helm chart
renders."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from nerserve.service.batching.fair_queue import FairQueue
from nerserve.service.tenants import ApiKeysError, SentenceBucket, Tenants, parse_api_keys, read_api_keys
from tests.serving import Server

KEY_A, KEY_B = "team-a-" + "a" * 24, "team-b-" + "b" * 24


def test_keys_are_read_from_json_with_names_weights_and_ceilings() -> None:
    keys = parse_api_keys(json.dumps({"team-a": KEY_A, "team-b": {"key": KEY_B, "weight": 2, "max_sentences_per_second": 5}}))
    assert keys["team-a"].weight == 1.0 and keys["team-b"].weight == 2.0
    assert keys["team-b"].max_sentences_per_second == 5
    assert KEY_B not in repr(keys) and KEY_B not in str(keys)  # a key is never printed
    for bad in (
        {"a b": KEY_A},
        {"unknown": KEY_A},
        {"x": "short"},
        {"a": KEY_A, "b": KEY_A},
        {"a": {"key": KEY_A, "weight": 0}},
    ):
        with pytest.raises((ValueError, ValidationError)):
            parse_api_keys(json.dumps(bad))
    with pytest.raises(ValueError, match="not both"):
        read_api_keys(SecretStr("{}"), __import__("pathlib").Path("/keys.json"))
    assert read_api_keys(None, None) == {}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            "{team-a: 1}",
            "NERSERVE_API_KEYS: not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)",
        ),
        ('["a"]', "NERSERVE_API_KEYS: a JSON object of names"),
        ('{"team-a": "short-secret"}', "NERSERVE_API_KEYS: team-a.key: a key needs at least 16 characters"),
        ('{"team-a": 7}', "NERSERVE_API_KEYS: team-a: a key, or an object {key, weight, max_sentences_per_second}"),
        (
            json.dumps({"team-a": {"key": KEY_A, "weight": 0}}),
            "NERSERVE_API_KEYS: team-a.weight: Input should be greater than 0",
        ),
        (
            json.dumps({"team-a": {"key": KEY_A, "wieght": 2}}),
            "NERSERVE_API_KEYS: team-a.wieght: Extra inputs are not permitted",
        ),
    ],
)
def test_keys_that_cannot_be_read_are_said_where_and_why_never_with_a_key(given: str, said: str) -> None:
    with pytest.raises(ApiKeysError) as raised:
        read_api_keys(SecretStr(given), None)
    assert str(raised.value).startswith(said)
    assert "short-secret" not in str(raised.value) and KEY_A not in str(raised.value)


def test_a_server_with_keys_it_cannot_read_exits_at_once_saying_why(tmp_path: Path) -> None:
    env = {**os.environ, "NERSERVE_API_KEYS_FILE": str(tmp_path / "keys.json"), "NERSERVE_PORT": "0"}
    ended = subprocess.run([sys.executable, "-m", "nerserve", "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert ended.returncode != 0
    assert (
        ended.stderr.strip()
        .splitlines()[-1]
        .startswith(f"nerserve: NERSERVE_API_KEYS_FILE {tmp_path / 'keys.json'}: cannot be read")
    )
    assert "Traceback" not in ended.stderr


def test_a_bearer_key_is_identified_by_name_and_anything_else_is_not() -> None:
    tenants = Tenants(parse_api_keys(json.dumps({"team-a": KEY_A, "team-b": KEY_B})))
    assert tenants.identify(f"Bearer {KEY_A}") == "team-a"
    assert tenants.identify(f"bearer {KEY_B}") == "team-b"
    for wrong in (None, "", KEY_A, f"Basic {KEY_A}", f"Bearer {KEY_A}x", f"Bearer {KEY_A[:-1]}", "Bearer "):
        assert tenants.identify(wrong) is None
    assert not Tenants().enabled and Tenants().weight("anyone") == 1.0


def test_a_ceiling_lets_a_seconds_worth_through_then_refuses_until_it_refills() -> None:
    bucket = SentenceBucket(rate=10.0, level=10.0, stamp=0.0)
    assert bucket.charge(6, now=0.0) == 0.0 and bucket.charge(4, now=0.0) == 0.0
    assert bucket.charge(1, now=0.0) == pytest.approx(0.1)  # refused: a tenth of a second to refill
    assert bucket.charge(5, now=0.5) == 0.0  # half a second: five sentences back
    assert bucket.charge(50, now=10.0) == 0.0  # one request over a second's worth, when full: taken...
    assert bucket.charge(1, now=10.5) > 0  # ...and paid back before the next


@dataclass
class Sentence:
    tenant: str
    request: int
    tag: int
    cost: int = 10
    due: float = float("inf")
    enqueued: float = 0.0


def test_tenants_share_by_weight_and_a_newcomer_starts_level() -> None:
    """A (weight 1) and B (weight 3) both have a backlog: B gets three sentences for each of A's;
    C, arriving after many batches, starts level with them instead of claiming what it missed."""
    queue: FairQueue[Sentence] = FairQueue(lambda tenant: {"a": 1.0, "b": 3.0}.get(tenant, 1.0))
    queue.push(Sentence("a", 1, tag) for tag in range(100))
    queue.push(Sentence("b", 2, tag) for tag in range(100))
    first = queue.order(40, answered_by=0.0)
    assert sum(s.tenant == "b" for s in first) == 30 and sum(s.tenant == "a" for s in first) == 10
    for _ in range(5):
        queue.take(queue.order(16, answered_by=0.0))
    queue.push([Sentence("c", 3, 0)])
    assert [s.tenant for s in queue.order(5, answered_by=0.0)].count("c") == 1


def test_the_wait_counts_the_other_tenants_share_only() -> None:
    """Beside a tenant with a large backlog, another tenant's one-sentence request waits on one
    sentence of it (equal weights), not on all of it."""
    queue: FairQueue[Sentence] = FairQueue()
    queue.push(Sentence("a", 1, tag) for tag in range(500))
    assert queue.ahead_of("b", 1) == 10  # one of a's 10-sub-word sentences
    assert queue.ahead_of("a", 1) == 10 * 1  # within a: a round of its one request
    assert queue.ahead_of("a", 3) == 30


def test_fair_share_by_key_in_the_scheduler() -> None:
    """Key A's 300 sentences queued first, key B's one sentence after them: B runs in the first
    batches, not after A's."""
    from nerserve.service.batching.packing import BatchLimits
    from nerserve.service.batching.scheduler import Scheduler

    async def scenario() -> list[list[str]]:
        batches: list[list[str]] = []

        def run(prepared: list[str]) -> list[str]:
            batches.append(list(prepared))
            return prepared

        scheduler = Scheduler(prepare=lambda p: p, run=run, limits=BatchLimits(max_batch_size=8, max_wait_ms=0))
        many = [scheduler.submit([(f"a{i}", 1)], tenant="team-a") for i in range(300)]
        one = scheduler.submit([("b0", 1)], tenant="team-b")
        scheduler.start()
        await asyncio.gather(*one, *[f for fs in many for f in fs])
        await scheduler.stop()
        return batches

    batches = asyncio.run(scenario())
    assert any("b0" in batch for batch in batches[:2]), batches[:3]


@pytest.fixture(scope="module")
def keyed_server() -> object:
    """A server started with the NERSERVE_API_KEYS the Helm chart's Secret holds."""
    from tests.test_deploy import rendered

    values = {"apiKeys": {"keys": {"team-a": KEY_A, "team-b": {"key": KEY_B, "max_sentences_per_second": 2}}}}
    (secret,) = [d for d in rendered(values) if d["kind"] == "Secret"]
    keys_json = secret["stringData"]["api-keys.json"]  # type: ignore[index]
    instance = Server(models="span-conll03", threads=1, api_keys=keys_json)
    instance.wait_ready()
    yield instance
    instance.stop()


def _extract(server: Server, key: str | None, path: str = "/extract", body: object = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(
        f"{server.url}{path}", json=body or {"texts": ["Angela Merkel visited Paris."]}, headers=headers, timeout=30
    )


def test_keys_at_the_door(keyed_server: Server) -> None:
    server = keyed_server
    missing = _extract(server, None)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert _extract(server, "not-a-key-" + "x" * 20).status_code == 401
    answered = _extract(server, KEY_A)
    assert answered.status_code == 200 and answered.json()["results"][0]["entities"]
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["Angela Merkel visited Paris."]}
    assert _extract(server, None, "/v2/models/span-conll03/infer", {"inputs": [tensor]}).status_code == 401
    assert _extract(server, KEY_A, "/v2/models/span-conll03/infer", {"inputs": [tensor]}).status_code == 200
    assert httpx.get(f"{server.url}/models").status_code == 401
    assert httpx.get(f"{server.url}/models", headers={"authorization": f"Bearer {KEY_A}"}).status_code == 200
    for open_route in ("/health/live", "/health/ready", "/info", "/metrics", "/v2/health/ready"):
        assert httpx.get(f"{server.url}{open_route}").status_code == 200, open_route


def test_a_key_over_its_ceiling_is_refused_alone(keyed_server: Server) -> None:
    server = keyed_server
    statuses = [_extract(server, KEY_B).status_code for _ in range(4)]  # 2 sentences/s, a second's worth at once
    assert statuses[:2] == [200, 200] and 429 in statuses[2:]
    refused = next(r for s, r in ((s, _extract(server, KEY_B)) for s in range(3)) if r.status_code == 429)
    assert refused.json()["error"]["code"] == "key_over_ceiling" and int(refused.headers["retry-after"]) >= 1
    assert all(_extract(server, KEY_A).status_code == 200 for _ in range(4))  # team-a untouched


def test_metrics_and_stats_by_key_name_never_the_key(keyed_server: Server) -> None:
    server = keyed_server
    _extract(server, KEY_A)
    _extract(server, None)
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'nerserve_key_requests_total{key="team-a",status="200"}' in metrics
    assert 'nerserve_key_requests_total{key="unknown",status="401"}' in metrics
    assert 'nerserve_key_sentences_total{key="team-a"}' in metrics
    assert 'nerserve_requests_total{model="",status="401"}' in metrics  # counted like every response
    stats = httpx.get(f"{server.url}/stats", headers={"authorization": f"Bearer {KEY_A}"}).json()
    assert stats["keys"]["team-a"]["requests"]["200"] >= 1 and stats["keys"]["team-a"]["sentences"] >= 1
    assert stats["keys"]["team-b"]["refused"] >= 1
    server.stop()  # the log is complete once the process has ended
    log = server.process.stderr.read().decode()  # type: ignore[union-attr]
    assert "API keys: 2 (team-a, team-b)" in log
    for key in (KEY_A, KEY_B):
        assert key not in metrics and key not in json.dumps(stats) and key not in log
