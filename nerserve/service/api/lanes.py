"""The extraction routes' usual requests answered without FastAPI's dispatch: POST /extract with a
JSON body of declared length that its request model accepts, and the KServe v2 `infer` with a body
of declared length. Each lane runs its route's own work (`routes.extraction_answer`,
`v2.infer_answer`) with the same models and the same error bodies; anything else (a body /extract's
model refuses, other media types, a streamed body, a client gone while sending) goes on to FastAPI
with the body as read, which answers as the route always has.

Why: an HTTP worker's CPU a request is what a GPU node's front is bought with (its answers going out
and the next requests coming in are the device's idle time between cohorts), and FastAPI's dispatch
(its middleware, routing, dependency solving and response checking) was the larger part of that CPU
(docs/decisions/http-workers.md, "A worker's CPU a request")."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nerserve.service.api.errors import ApiError, api_error_handler
from nerserve.service.api.routes import extraction_answer, timing_headers
from nerserve.service.api.schemas import ExtractRequest, ExtractResponse
from nerserve.service.api.v2 import infer_answer

EXTRACT_PATH = "/extract"
# the v2 route's two paths, as Starlette matches their {name} and {version}
INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
ANSWER = TypeAdapter(ExtractResponse)

# a lane's answer to a request's whole body; None: FastAPI answers it instead
Lane = Callable[[bytes, Request], Awaitable[Response | None]]


class Lanes:
    """In front of the FastAPI application's routes, inside the middleware that counts, limits and
    admits every request (service.main), so that a request taking a lane is counted, limited and
    admitted as any other."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = lane_for(scope)
        if lane is None:
            await self.app(scope, receive, send)
            return
        received = await whole_body(receive)
        response = None
        if received[-1]["type"] == "http.request":  # not a client gone while sending
            response = await lane(b"".join(message.get("body", b"") for message in received), Request(scope, receive))
        if response is None:  # FastAPI's answer, exactly as without the lane
            await self.app(scope, replaying(received, receive), send)
            return
        await response(scope, receive, send)


def lane_for(scope: Scope) -> Lane | None:
    """The lane for a POST of declared length to an extraction route, if any."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path = scope["path"]
    if path != EXTRACT_PATH and not path.startswith("/v2/"):
        return None
    headers = dict(scope["headers"])
    if b"content-length" not in headers:
        return None
    if path == EXTRACT_PATH:
        media_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        return extract_lane if media_type == b"application/json" else None
    matched = INFER_PATH.fullmatch(path)
    if matched is None:
        return None
    name, version = matched["name"], matched["version"]

    async def infer_lane(body: bytes, request: Request) -> Response:
        return await answered(infer_answer(request, name, version, body), request)

    return infer_lane


async def whole_body(receive: Receive, limit: int | None = None) -> list[Message]:
    """The request's messages up to its body's end, or up to the client's going away; a 413
    (ApiError) as soon as the body passes LIMIT bytes, where one is given."""
    received = [await receive()]
    size = len(received[0].get("body", b""))
    while received[-1]["type"] == "http.request" and received[-1].get("more_body", False):
        if limit is not None and size > limit:
            break
        received.append(await receive())
        size += len(received[-1].get("body", b""))
    if limit is not None and size > limit:
        raise ApiError("payload_too_large", f"request body over {limit} bytes")
    return received


def replaying(received: list[Message], receive: Receive) -> Receive:
    pending = list(received)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


async def extract_lane(body: bytes, request: Request) -> Response | None:
    """/extract's answer to a body its model accepts; None for one it refuses (FastAPI says why)."""
    try:
        parsed = ExtractRequest.model_validate_json(body)
    except ValidationError:
        return None
    return await answered(extract_answer(parsed, request), request)


async def extract_answer(parsed: ExtractRequest, request: Request) -> Response:
    content, done = await extraction_answer(parsed, request)
    response = Response(answer_json(content), media_type="application/json")
    timing_headers(response, done)
    return response


async def answered(answer: Awaitable[Response], request: Request) -> Response:
    try:
        return await answer
    except ApiError as error:  # answered as the app's handler answers it behind FastAPI
        return await api_error_handler(request, error)


def answer_json(content: dict[str, Any]) -> bytes:
    """The answer as FastAPI writes a route's response model: checked against it, then dumped."""
    return ANSWER.dump_json(ANSWER.validate_python(content))
