"""POST /extract's usual request (a JSON body of declared length that the request model accepts)
answered without FastAPI's dispatch: the route's own work (`routes.extraction_answer`), the same
request and response models, the same error bodies; anything else (a body the model refuses, other
media types, a streamed body, a client gone while sending) goes on to FastAPI with the body as
read, which answers as the route always has.

Why: an HTTP worker's CPU a one-sentence request is what a GPU node's front is bought with (its
answers going out and the next requests coming in are the device's idle time between cohorts),
and FastAPI's dispatch (its middleware, routing, dependency solving and response checking) was the
larger part of that CPU (docs/decisions/http-workers.md, "A worker's CPU a request")."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nerserve.service.api.errors import ApiError, api_error_handler
from nerserve.service.api.routes import extraction_answer, timing_headers
from nerserve.service.api.schemas import ExtractRequest, ExtractResponse

EXTRACT_PATH = "/extract"
ANSWER = TypeAdapter(ExtractResponse)


class ExtractLane:
    """In front of the FastAPI application's routes, inside the middleware that counts, limits and
    admits every request (service.main), so that a request taking the lane is counted, limited and
    admitted as any other."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not takes_lane(scope):
            await self.app(scope, receive, send)
            return
        received = await whole_body(receive)
        parsed = accepted(received)
        if parsed is None:  # FastAPI's answer, exactly as without the lane
            await self.app(scope, replaying(received, receive), send)
            return
        response = await answer(parsed, Request(scope, receive))
        await response(scope, receive, send)


def takes_lane(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["path"] != EXTRACT_PATH or scope["method"] != "POST":
        return False
    headers = dict(scope["headers"])
    media_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    return media_type == b"application/json" and b"content-length" in headers


async def whole_body(receive: Receive) -> list[Message]:
    """The request's messages up to its body's end, or up to the client's going away."""
    received = [await receive()]
    while received[-1]["type"] == "http.request" and received[-1].get("more_body", False):
        received.append(await receive())
    return received


def accepted(received: list[Message]) -> ExtractRequest | None:
    """The request as its model reads it; None for a body it refuses, or a client gone while sending."""
    if received[-1]["type"] != "http.request":
        return None
    try:
        return ExtractRequest.model_validate_json(b"".join(message.get("body", b"") for message in received))
    except ValidationError:
        return None


def replaying(received: list[Message], receive: Receive) -> Receive:
    pending = list(received)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


async def answer(parsed: ExtractRequest, request: Request) -> Response:
    try:
        content, done = await extraction_answer(parsed, request)
    except ApiError as error:  # answered as the app's handler answers it behind FastAPI
        return await api_error_handler(request, error)
    response = Response(answer_json(content), media_type="application/json")
    timing_headers(response, done)
    return response


def answer_json(content: dict[str, Any]) -> bytes:
    """The answer as FastAPI writes a route's response model: checked against it, then dumped."""
    return ANSWER.dump_json(ANSWER.validate_python(content))
