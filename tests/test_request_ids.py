"""Request ids and the server's logs: every response names its request's id (`X-Request-Id`, the
client's when well formed), the access log's lines name it too, and `--log-format json` makes every
line of every process one JSON object. End to end on a real server with two HTTP workers (the
committed span-conll03 through ONNX Runtime), and the middleware alone for an unexpected error."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from nerserve.client import Client, NerServeError
from nerserve.service.logs import JsonLines
from nerserve.service.main import CountResponses
from nerserve.service.request_ids import RequestIds, request_id_of, trace_id_of
from tests.serving import Server

KEY = "sk-request-ids-test-0123456789"
SENTENCE = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
MADE_HERE = re.compile(r"[0-9a-f]{16}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    keys = json.dumps({"team-a": {"key": KEY}})
    log = tmp_path_factory.mktemp("logs") / "server.log"
    running = Server(
        log=log, models="span-conll03", threads=1, http_workers=2, api_keys=keys, access_log="true", log_format="json"
    )
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def access_lines(server: Server, request_id: str) -> list[dict[str, Any]]:
    """The server's access lines naming REQUEST_ID (a worker writes its line as it answers: waited for)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in server.logged().splitlines() if line.strip()]
        found = [line for line in lines if line["logger"] == "nerserve.access" and line.get("request_id") == request_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.e2e
def test_a_clients_request_id_comes_back_and_is_logged_with_the_request(server: Server) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {
        "authorization": f"Bearer {KEY}",
        "x-request-id": "checkout-7f3a/42",
        "traceparent": f"00-{trace}-00f067aa0ba902b7-01",
    }
    response = httpx.post(f"{server.url}/extract", json={"tokens": [SENTENCE]}, headers=headers, timeout=60)
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "checkout-7f3a/42"
    [line] = access_lines(server, "checkout-7f3a/42")
    assert line["method"] == "POST" and line["path"] == "/extract" and line["status"] == 200
    assert line["model"] == "span-conll03" and line["key"] == "team-a" and line["duration_ms"] > 0
    assert line["process"] in ("http-0", "http-1") and line["level"] == "INFO"
    assert line["trace_id"] == trace and f"trace_id={trace}" in line["message"]


@pytest.mark.e2e
def test_every_response_has_a_request_id_made_here_when_the_client_sent_none_or_a_malformed_one(server: Server) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    answers = {
        "ok": httpx.post(f"{server.url}/extract", json={"tokens": [SENTENCE]}, headers=auth, timeout=60),
        "invalid": httpx.post(f"{server.url}/extract", json={"tokens": "EU"}, headers=auth, timeout=60),
        "unknown model": httpx.post(f"{server.url}/extract", json={"model": "nope", "texts": ["a"]}, headers=auth),
        "no key (answered by the worker's protocol)": httpx.post(f"{server.url}/extract", json={"texts": ["a"]}),
        "v2": httpx.post(
            f"{server.url}/v2/models/span-conll03/infer",
            json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["EU rejects it."]}]},
            headers=auth,
            timeout=60,
        ),
        "health": httpx.get(f"{server.url}/health/live"),
        "too long": httpx.get(f"{server.url}/health/live", headers={"x-request-id": "x" * 129}),
        "with a space": httpx.get(f"{server.url}/health/live", headers={"x-request-id": "two words"}),
    }
    statuses = {what: response.status_code for what, response in answers.items()}
    assert statuses == {
        "ok": 200,
        "invalid": 422,
        "unknown model": 404,
        "no key (answered by the worker's protocol)": 401,
        "v2": 200,
        "health": 200,
        "too long": 200,
        "with a space": 200,
    }
    ids = {what: response.headers.get("x-request-id", "") for what, response in answers.items()}
    assert all(MADE_HERE.fullmatch(request_id) for request_id in ids.values()), ids
    assert len(set(ids.values())) == len(ids)
    [refused] = access_lines(server, ids["no key (answered by the worker's protocol)"])
    assert refused["status"] == 401 and refused["key"] is None


@pytest.mark.e2e
def test_every_line_of_every_process_is_one_json_object(server: Server) -> None:
    lines = [json.loads(line) for line in server.logged().splitlines() if line.strip()]
    assert {line["process"] for line in lines} >= {"engine", "http-0", "http-1"}
    assert all({"time", "level", "logger", "process", "message"} <= line.keys() for line in lines)
    assert any(line["logger"].startswith("uvicorn") for line in lines)  # uvicorn's own lines too
    assert any(line["message"] == "ready: span-conll03" and line["process"] == "engine" for line in lines)


@pytest.mark.e2e
def test_the_python_client_names_the_request_id_of_an_error(server: Server) -> None:
    with Client(server.url, api_key=KEY) as client, pytest.raises(NerServeError) as raised:
        client.extract(["EU rejects German call."], model="not-served")
    assert raised.value.status == 404
    assert raised.value.request_id is not None and MADE_HERE.fullmatch(raised.value.request_id)
    assert raised.value.request_id in str(raised.value)


async def failing_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("a bug")


def test_an_unexpected_error_is_a_json_500_whose_log_line_names_its_request_id(caplog: pytest.LogCaptureFixture) -> None:
    recorded: list[tuple[str, int]] = []
    app = RequestIds(CountResponses(failing_app, lambda model, status, key, seconds: recorded.append((model, status))))

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.get("/health/live", headers={"x-request-id": "req-1"})

    with caplog.at_level(logging.ERROR, logger="nerserve"):
        response = asyncio.run(get())
    assert response.status_code == 500 and response.headers["x-request-id"] == "req-1"
    assert response.json()["error"]["code"] == "internal" and "req-1" in response.json()["error"]["message"]
    assert recorded == [("", 500)]
    assert "request id req-1" in caplog.text and "RuntimeError: a bug" in caplog.text


def test_a_request_id_is_the_clients_when_well_formed_and_kept_once_made() -> None:
    assert request_id_of({"headers": [(b"x-request-id", b"abc-DEF_1.2:3")]}) == "abc-DEF_1.2:3"
    for malformed in (b"", b"a b", b"x" * 129, "é".encode(), b"a\tb"):
        assert MADE_HERE.fullmatch(request_id_of({"headers": [(b"x-request-id", malformed)]}))
    scope: dict[str, Any] = {"headers": []}
    assert request_id_of(scope) == request_id_of(scope)


def test_a_trace_id_is_read_from_a_valid_traceparent_only() -> None:
    def trace(value: bytes) -> str | None:
        return trace_id_of({"headers": [(b"traceparent", value)]})

    assert trace(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == "4bf92f3577b34da6a3ce929d0e0e4736"
    for invalid in (
        b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01",
        b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        b"00-4bf9-01",
        b"",
    ):
        assert trace(invalid) is None
    assert trace_id_of({"headers": []}) is None


def test_a_python_warning_is_a_log_line_in_the_servers_format() -> None:
    """In a process of its own, as a server's (pytest records warnings itself)."""
    script = (
        "import warnings\nfrom nerserve.service.logs import configure_logging\n"
        "configure_logging('json', 'http-0')\nwarnings.warn('an old option', DeprecationWarning, stacklevel=1)\n"
    )
    ended = subprocess.run([sys.executable, "-W", "default", "-c", script], capture_output=True, text=True, timeout=60)
    [line] = [json.loads(text) for text in ended.stderr.strip().splitlines()]
    assert line["logger"] == "py.warnings" and "DeprecationWarning: an old option" in line["message"]


def test_a_json_log_line_carries_the_records_fields_and_its_exception() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        record = logging.LogRecord("nerserve", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    record.__dict__.update({"request_id": "r-1", "status": 500})
    line = json.loads(JsonLines("http-3").format(record))
    assert line["message"] == "failed here" and line["process"] == "http-3" and line["level"] == "ERROR"
    assert line["request_id"] == "r-1" and line["status"] == 500
    assert "ValueError: broken" in line["exception"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
