"""The extraction routes' lanes (service.api.lanes): which requests they answer themselves and which
go on to FastAPI with their body exactly as sent (their answers against the routes' own, end to end:
tests/test_service.py::test_the_lane_answers_as_the_route and tests/test_kserve_v2.py); the tokens'
check every extraction runs in the HTTP process."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from starlette.types import Message, Scope

from nerserve.service.api.errors import ApiError
from nerserve.service.api.extraction import check_tokens
from nerserve.service.api.lanes import Lanes
from nerserve.service.api.state import ServiceState
from nerserve.service.config import Settings


class App:
    """Stands for FastAPI's dispatch: records what reached it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


class Service:
    state = type("AppState", (), {"service": ServiceState(Settings(models="span-conll03"))})()


def scope(path: str = "/extract", method: str = "POST", **headers: str) -> Scope:
    return {
        "type": "http",
        "path": path,
        "method": method,
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
        "app": Service(),
        "state": {},
    }


def body_of(chunks: list[bytes]) -> list[Message]:
    return [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)]


def run(lane_scope: Scope, incoming: list[Message]) -> tuple[App, list[Message]]:
    return asyncio.run(_run(lane_scope, incoming))


async def _run(lane_scope: Scope, incoming: list[Message]) -> tuple[App, list[Message]]:
    downstream, sent = App(), []

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await Lanes(downstream)(lane_scope, receive, send)
    return downstream, sent


VALID = json.dumps({"texts": ["Peter went to Paris."]}).encode()
JSON = {"content_type": "application/json", "content_length": str(len(VALID))}


def test_a_valid_request_is_answered_by_the_lane_with_the_route_s_errors() -> None:
    downstream, sent = run(scope(**JSON), body_of([VALID[:10], VALID[10:]]))
    assert downstream.bodies == []  # answered here: the service is not ready yet, as the route says
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"])["error"] == {"code": "not_ready", "message": "models are still loading", "field": None}


INFER = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["Peter went to Paris."]}]}).encode()


@pytest.mark.parametrize("path", ["/v2/models/span-conll03/infer", "/v2/models/span-conll03/versions/1/infer"])
@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream", ""])
def test_a_v2_inference_is_answered_by_its_lane_whatever_its_body(path: str, content_type: str) -> None:
    """The v2 route reads its body itself (JSON, or a JSON header and binary tensors), and says in
    its own errors what is wrong with one: every body of declared length takes the lane."""
    for body in (INFER, b"{not json"):
        downstream, sent = run(scope(path, content_type=content_type, content_length=str(len(body))), body_of([body]))
        assert downstream.bodies == []
        assert sent[0]["status"] == 503  # as the route answers before its models are ready
        assert json.loads(sent[1]["body"]) == {"error": "models are still loading"}


@pytest.mark.parametrize(
    ("lane_scope", "chunks"),
    [
        (scope(**JSON), [b'{"texts": ["a"], "bogus": 1}']),  # the model refuses it: FastAPI's 422
        (scope(**JSON), [b'{"texts": [']),  # not JSON: FastAPI's 400
        (scope(content_type="application/json"), [VALID]),  # streamed, no declared length
        (scope(content_type="text/plain", content_length=str(len(VALID))), [VALID]),
        (scope(path="/v2/models/m/ready", **JSON), [VALID]),
        (scope(path="/v2/models/m/infer/more", **JSON), [VALID]),
        (scope(path="/v2/models/m/infer", content_type="application/json"), [INFER]),  # streamed
        (scope(method="PUT", **JSON), [VALID]),
    ],
    ids=["refused", "malformed", "streamed", "text-plain", "other-path", "longer-path", "v2-streamed", "other-method"],
)
def test_everything_else_goes_on_with_its_body_as_sent(lane_scope: Scope, chunks: list[bytes]) -> None:
    downstream, sent = run(lane_scope, body_of(chunks))
    assert downstream.bodies == [b"".join(chunks)]
    assert sent[0]["status"] == 299


def test_a_client_gone_while_sending_goes_on_to_fastapi() -> None:
    gone: list[Message] = [{"type": "http.request", "body": VALID[:10], "more_body": True}, {"type": "http.disconnect"}]
    downstream, _ = run(scope(**JSON), gone)
    assert downstream.bodies == [VALID[:10]]  # FastAPI meets the disconnect as it always has


@pytest.mark.parametrize(
    ("tokens", "where"),
    [
        ([["Peter", "went", "."], ["ok"]], None),
        ([["a"], []], "tokens[1]"),
        ([["a", ""]], "tokens[0][1]"),
        ([[" a"]], "tokens[0][0]"),
        ([["x", "a\u00a0b"]], "tokens[0][1]"),
        ([["a\u2028"]], "tokens[0][0]"),
        ([["a\u200bb"]], None),  # a zero-width space is not whitespace to str.isspace
    ],
)
def test_tokens_are_checked_where_they_fail(tokens: list[list[str]], where: str | None) -> None:
    if where is None:
        check_tokens(tokens)
        return
    with pytest.raises(ApiError) as refused:
        check_tokens(tokens)
    assert refused.value.field == where


def test_every_whitespace_character_splits_a_token() -> None:
    """The C-speed check (join, then split) holds exactly where str.isspace does."""
    differ = [c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace() != (len(f"a{c}b".split()) == 2)]
    assert differ == []
