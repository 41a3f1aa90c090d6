"""`--http-workers 2`: an engine process and two HTTP worker processes, end to end on a real server
(the committed span-conll03 through ONNX Runtime): the one-process server's answers and errors, one
/metrics for every worker, API keys at the workers' door with the counts in the engine, a worker
that dies replaced, SIGTERM draining what was admitted."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nerserve.loadtest.client import growth_by_label, parse_metrics
from tests.serving import Server, assert_a_hang_up_leaves_its_sentences_unrun, assert_same_results, spawned_children

pytestmark = pytest.mark.e2e
SENTENCES = [
    ["Peter", "Blackburn", "reported", "from", "Brussels", "on", "Friday", "."],
    ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
    ["Angela", "Merkel", "met", "Siemens", "executives", "in", "Munich", "."],
]
KEY = "sk-workers-test-0123456789"


@pytest.fixture(scope="module")
def batch_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batch-log") / "batches.jsonl"


@pytest.fixture(scope="module")
def servers(batch_log: Path) -> Iterator[tuple[Server, Server]]:
    keys = json.dumps({"team-a": {"key": KEY, "max_sentences_per_second": 1000}})
    single = Server(models="span-conll03", threads=1)
    split = Server(models="span-conll03", threads=1, http_workers=2, api_keys=keys, batch_log=batch_log)
    try:
        single.wait_ready()
        split.wait_ready()
        yield single, split
    finally:
        single.stop()
        split.stop()


def post(server: Server, path: str, payload: object, key: str | None = KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}{path}", json=payload, headers=headers, timeout=60)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit is reaped by whoever adopted it, maybe never here)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def counted(metrics: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.MULTILINE)
    return float(found[1]) if found else 0.0


def test_the_split_server_answers_as_the_one_process_server(servers: tuple[Server, Server]) -> None:
    single, split = servers
    texts = {"texts": ["Angela Merkel visited Paris with Siemens.", "No entity here."]}
    want = post(single, "/extract", texts, key=None).json()
    for _ in range(6):  # whichever worker takes the connection
        got = post(split, "/extract", texts).json()
        assert got["model"] == want["model"] and got["version"] == want["version"]
        assert_same_results(got["results"], want["results"])
    tokens = post(split, "/extract", {"tokens": SENTENCES}).json()["results"]
    assert_same_results(tokens, post(single, "/extract", {"tokens": SENTENCES}, key=None).json()["results"])
    # planned and assembled in the worker: several sentences a text, a sentence long enough for
    # windows (a request large enough to be planned off the worker's loop), labels kept, flat answers
    long_sentence = " ".join(["Angela Merkel met Siemens executives in Munich and"] * 120) + " Paris ."
    for payload in [
        {"texts": ["Peter Blackburn reported from Brussels. EU rejects German call.", long_sentence]},
        {"texts": [long_sentence], "labels": ["PER", "LOC"], "flat": True},
    ]:
        want_planned = post(single, "/extract", payload, key=None).json()["results"]
        assert sum(len(found["entities"]) for found in want_planned) > 100  # every window answers
        assert_same_results(post(split, "/extract", payload).json()["results"], want_planned)
    for payload, status, field in [
        ({"model": "nope", "texts": ["x"]}, 404, "model"),
        ({"texts": ["x"], "options": {"threshold": 7}}, 422, "options.threshold"),
        ({"texts": ["x"], "labels": ["XYZ"]}, 422, "labels[0]"),
    ]:
        answered = post(split, "/extract", payload)
        assert answered.status_code == status and answered.json()["error"]["field"] == field
        assert answered.json() == post(single, "/extract", payload, key=None).json()
    v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Angela Merkel visited Paris."]}]}
    single_v2 = post(single, "/v2/models/span-conll03/infer", v2, key=None).json()
    assert post(split, "/v2/models/span-conll03/infer", v2).json() == single_v2
    info = httpx.get(f"{split.url}/info").json()
    assert info["http_workers"] == 2 and info["models"] == {"span-conll03": "ready"}
    models = httpx.get(f"{split.url}/models", headers={"authorization": f"Bearer {KEY}"}).json()
    assert _untimed(models) == _untimed(httpx.get(f"{single.url}/models").json())


def _untimed(listing: dict[str, Any]) -> dict[str, Any]:
    """GET /models without what each server's warm-up took (which differs by the run)."""
    models = listing["models"]
    assert all(model["warm_up"]["one_sentence_first_ms"] > 0 for model in models)
    return {**listing, "models": [{**model, "warm_up": None} for model in models]}


def test_the_engine_logs_each_batchs_way_through_it(servers: tuple[Server, Server], batch_log: Path) -> None:
    """`--batch-log`: the engine process (not the workers, which run no batch) appends a line per
    batch, its times in the order a batch lives them, on the machine's monotonic clock."""
    _, split = servers
    before = time.monotonic()
    logged = len(batch_log.read_text().splitlines()) if batch_log.exists() else 0
    assert post(split, "/extract", {"tokens": SENTENCES}).status_code == 200
    for _ in range(100):  # the answer goes out before its batch's line is written
        lines = batch_log.read_text().splitlines() if batch_log.exists() else []
        if len(lines) > logged:
            break
        time.sleep(0.05)
    new = [json.loads(line) for line in lines[logged:]]
    assert new and sum(line["sentences"] for line in new) >= len(SENTENCES)
    for line in new:
        at = line["at"]
        assert before <= at["closed"] <= at["handed"] <= at["taken"] <= at["started"] <= at["finished"] <= at["answered"]
        assert line["model"] == "span-conll03" and line["closed"] and line["lane"] in (0, 1)
        assert line["subwords"] <= line["padded_subwords"] and line["queue_ms"]["min"] <= line["queue_ms"]["max"]


def test_one_metrics_for_every_worker_and_keys_at_their_door(servers: tuple[Server, Server]) -> None:
    _, split = servers
    before = httpx.get(f"{split.url}/metrics").text
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answered = list(pool.map(lambda _: post(split, "/extract", {"tokens": SENTENCES[:1]}), range(40)))
    refused = [post(split, "/extract", {"tokens": SENTENCES[:1]}, key=key) for key in (None, "sk-wrong")]
    assert all(r.status_code == 200 for r in answered)
    assert [r.status_code for r in refused] == [401, 401] and refused[0].json()["error"]["field"] == "authorization"
    time.sleep(0.2)  # a worker tells the engine of a response once it is written
    after = httpx.get(f"{split.url}/metrics").text  # answered by either worker: the engine's one registry
    for series, more in [
        ('nerserve_requests_total{model="span-conll03",status="200"}', 40),
        ('nerserve_key_requests_total{key="team-a",status="200"}', 40),
        ('nerserve_key_requests_total{key="unknown",status="401"}', 2),
        ('nerserve_key_sentences_total{key="team-a"}', 40),
        ('nerserve_sentences_total{model="span-conll03"}', 40),
    ]:
        assert counted(after, series) - counted(before, series) == more, series
    assert KEY not in after
    # the engine's threads by role: its graphs ran the 40 sentences, in the engine process
    by_role = growth_by_label(parse_metrics(before), parse_metrics(after), "nerserve_thread_cpu_seconds_total", "role")
    assert {"loop", "graphs"} <= set(by_role) and by_role["graphs"] > 0, by_role
    stats = httpx.get(f"{split.url}/stats", headers={"authorization": f"Bearer {KEY}"}).json()
    assert stats["span-conll03"]["sentences"] >= 40 and stats["keys"]["team-a"]["requests"]["200"] >= 40


def connections_held(pids: list[int], port: int) -> dict[int, int]:
    """Established TCP connections to `port` that each process holds (its socket descriptors
    matched with the kernel's table by inode)."""
    established = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            established.add(fields[9])
    held = {}
    for pid in pids:
        links = (os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir())
        held[pid] = sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in established)
    return held


def test_connections_spread_over_the_workers(servers: tuple[Server, Server]) -> None:
    """Each worker listens on a socket of its own: a burst of new connections is spread by the
    kernel rather than taken by the first worker to wake."""
    _, split = servers

    async def burst() -> dict[int, int]:
        async def one() -> asyncio.StreamWriter:
            reader, writer = await asyncio.open_connection("127.0.0.1", split.port)
            writer.write(b"GET /health/live HTTP/1.1\r\nHost: test\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            return writer

        writers = await asyncio.gather(*(one() for _ in range(16)))
        try:
            return connections_held(spawned_children(split.process.pid), split.port)
        finally:
            for writer in writers:
                writer.close()

    for _ in range(5):  # 16 on one worker: 1 round in 30,000 by chance
        held = asyncio.run(burst())
        assert sum(held.values()) == 16 and min(held.values()) >= 1, held
        time.sleep(0.2)  # the round's connections closed


def test_a_client_gone_is_seen_through_a_worker(servers: tuple[Server, Server]) -> None:
    """The worker that holds the connection tells the engine, which drops what has not run."""
    assert_a_hang_up_leaves_its_sentences_unrun(servers[1], KEY)
    assert post(servers[1], "/extract", {"tokens": SENTENCES[:1]}).status_code == 200


def test_a_port_in_use_ends_the_server_saying_so() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = Server(models="span-conll03", http_workers=2, port=holder.getsockname()[1])
        assert server.process.wait(60) != 0
        assert "address already in use" in server.process.stderr.read().decode().lower()  # type: ignore[union-attr]


def test_a_worker_that_dies_is_replaced(servers: tuple[Server, Server]) -> None:
    _, split = servers
    workers = spawned_children(split.process.pid)
    assert len(workers) == 2
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    end = time.monotonic() + 30
    now = spawned_children(split.process.pid)
    while time.monotonic() < end and (len(now) < 2 or victim in now):  # one look at a time
        time.sleep(0.2)
        now = spawned_children(split.process.pid)
    assert len(now) == 2 and victim not in now
    for _ in range(10):  # both serve again; the dead one's admissions were released
        assert post(split, "/extract", {"tokens": SENTENCES[:1]}).status_code == 200


def test_sigterm_drains_every_worker_then_exits() -> None:
    # what is under test is the drain of two admitted requests: each is ~0.8 s of one graph thread's
    # work, and under the default 1 s bound admission may refuse one behind the other on a slow
    # machine (a correct 429 that says nothing of draining)
    server = Server(models="span-conll03", max_batch_size=4, threads=1, http_workers=2, max_queue_seconds=30)
    server.wait_ready()
    sentences = SENTENCES * 40
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pending = [pool.submit(post, server, "/extract", {"tokens": sentences}, None) for _ in range(2)]
        time.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        responses = [p.result(timeout=120) for p in pending]
    assert [r.status_code for r in responses] == [200, 200]
    assert all(len(r.json()["results"]) == len(sentences) for r in responses)
    assert server.process.wait(60) == 0


def test_a_model_that_cannot_load_ends_every_process_naming_it() -> None:
    server = Server(models="no-such-model", http_workers=2)
    assert server.process.wait(60) != 0
    assert "no-such-model" in server.process.stderr.read().decode()  # type: ignore[union-attr]


def test_workers_stop_when_the_engine_is_gone() -> None:
    """A worker without its engine could answer nothing: it stops rather than hold the port."""
    server = Server(models="span-conll03", threads=1, http_workers=2)
    server.wait_ready()
    workers = spawned_children(server.process.pid)
    server.process.kill()
    server.process.wait(10)
    end = time.monotonic() + 15
    while time.monotonic() < end and any(map(running, workers)):
        time.sleep(0.2)
    assert not [pid for pid in workers if running(pid)]


def test_overload_through_workers_refuses_small_and_large_bodies_alike() -> None:
    """A small body is admitted by the engine with its run, a larger one before it is read: under
    overload both are refused with the same 429 and Retry-After, the others answered in full, every
    refusal counted once, and once all are answered none stays counted as admitted."""
    server = Server(models="span-conll03", max_queue=8, max_request_sentences=8, max_batch_size=2, threads=1, http_workers=2)
    try:
        server.wait_ready()
        small = json.dumps({"tokens": [SENTENCES[0]] * 4})
        bodies = [small, small + " " * 5000]  # the same request, its body over the size admitted with a run

        def send(index: int) -> httpx.Response:
            headers = {"content-type": "application/json"}
            return httpx.post(f"{server.url}/extract", content=bodies[index % 2], headers=headers, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            responses = list(pool.map(send, range(64)))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429} and 200 in statuses
        assert 429 in statuses[0::2] and 429 in statuses[1::2]
        for refused in (r for r in responses if r.status_code == 429):
            assert refused.json()["error"]["code"] == "queue_full" and int(refused.headers["Retry-After"]) >= 1
        assert all(len(r.json()["results"]) == 4 for r in responses if r.status_code == 200)
        time.sleep(0.2)  # a worker tells the engine of a response once it is written
        metrics = httpx.get(f"{server.url}/metrics").text
        refusals = sum(float(v) for v in re.findall(r'^nerserve_requests_total\{[^}]*status="429"\} (\S+)$', metrics, re.M))
        assert refusals == statuses.count(429)
        assert counted(metrics, "nerserve_admitted_requests") == 0
    finally:
        server.stop()


def test_no_writable_temporary_folder_ends_the_engine_saying_what_to_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only root filesystem with nothing mounted at /tmp: the engine cannot make the folder
    of its workers' socket, and says what would let it serve (tests/containers runs the image so)."""
    import tempfile

    from nerserve.service import server
    from nerserve.service.config import Settings

    def read_only(*args: Any, **kwargs: Any) -> str:
        raise OSError(30, "Read-only file system", "/tmp")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    why = asyncio.run(server._engine_process(Settings(models=["span-conll03"], http_workers=2), None))
    assert why is not None and "Read-only file system" in why and "/tmp" in why and "--http-workers 1" in why


@pytest.mark.parametrize("workers", [1, 2])
def test_listening_on_every_interface_of_both_families(workers: int) -> None:
    """`--host ::` (an IPv6 or dual-stack cluster's pods): IPv6 and IPv4 alike, in one process (where
    asyncio's own bind of "::" would take IPv6 only) and through HTTP workers."""
    server = Server(models="span-conll03", threads=1, http_workers=workers, host="::")
    try:
        server.wait_ready()  # through 127.0.0.1
        response = httpx.post(f"http://[::1]:{server.port}/extract", json={"tokens": SENTENCES[:1]}, timeout=30)
        assert response.status_code == 200, response.text
        assert httpx.get(f"http://[::1]:{server.port}/info", timeout=10).json()["http_workers"] == workers
    finally:
        server.stop()
