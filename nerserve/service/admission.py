"""Admission at the HTTP edge: refuse at arrival, before a body is read, what could not be answered
within the bound, and do it cheaply (two raw ASGI messages, outside FastAPI's middleware stack; with
the engine in the process, one write from the HTTP protocol, service.http_protocol), on every route
that runs a model (POST /extract, POST /v2/models/{name}[/versions/{v}]/infer).

There is one estimate of a newcomer's wait, the scheduler's (`Scheduler.wait`: others' work ahead
of it in fair order ÷ the measured sub-words/s) and one bound (`max_queue_seconds`). The edge asks
it for a request of the median size, counting as queued work the requests it has let through that
have not reached a queue yet (being read, parsed, planned); the scheduler asks it again for the
request's real size once planned. Counting those requests is what makes the edge the stricter of
the two, so that a flood is refused here, before it is parsed, rather than after.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from nerserve.service.api.errors import ERROR_STATUS, error_body
from nerserve.service.auth import key_name, tenant_of
from nerserve.service.metrics import ResponseRecorder

V2_INFER = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?/infer$")
# In a request's scope state: the HTTP protocol decided at the edge already and let it through
# (counted in `EdgeCounter.in_flight`), so `EdgeAdmission` only releases it when it is answered.
LET_THROUGH = "edge_let_through"

# (model named by the route, or None when it is in the body; requests let through and not yet
# queued; the API key's name) → seconds of others' work a newcomer would wait on, or None when no
# model could take it
WaitEstimate = Callable[[str | None, int, str], float | None]


def model_route(scope: Scope) -> tuple[bool, str | None]:
    """Whether the request runs a model, and which one when the path names it."""
    if scope["type"] != "http" or scope.get("method") != "POST":
        return False, None
    path = scope.get("path", "")
    if path == "/extract":
        return True, None
    match = V2_INFER.match(path)
    return (True, match["model"]) if match else (False, None)


def declared_length(scope: Scope) -> int | None:
    """The body's size as its Content-Length header declares it; None without one (chunked)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


@dataclass(frozen=True)
class Refusal:
    wait: float  # seconds of others' work the request would wait on
    in_flight: int  # requests let through and not yet answered
    bound: float


def refusal_message(refusal: Refusal) -> str:
    return f"overloaded: {refusal.in_flight} requests in flight, about {refusal.wait:.1f} s of work ahead"


def refusal_retry_after(refusal: Refusal) -> str:
    """Seconds until the work ahead is back within the bound, for the Retry-After header."""
    return str(max(1, math.ceil(refusal.wait - refusal.bound)))


def refusal_answer(refusal: Refusal, path: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The 429's status, headers and JSON body, wherever it is written."""
    body = error_body("queue_full", refusal_message(refusal), path=path)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", refusal_retry_after(refusal).encode()),
    ]
    return ERROR_STATUS["queue_full"], headers, body


class EdgeAdmitter(Protocol):
    """Decides at the edge: the engine's own counter (EdgeCounter), or an HTTP worker's question to
    the engine process, which owns the count for every worker. `body_bytes`: the request's declared
    Content-Length, None when it declares none."""

    async def admit(self, model: str | None, tenant: str, body_bytes: int | None) -> Refusal | None: ...

    def release(self) -> None: ...


class EdgeCounter:
    """The requests let through and not yet answered, and the decision on a newcomer."""

    def __init__(self, bound: float, wait: WaitEstimate, open_requests: Callable[[], int]) -> None:
        self.bound = bound
        self.wait = wait
        self.open_requests = open_requests  # requests the schedulers hold (queued or running)
        self.in_flight = 0  # requests let through here and not yet answered

    @property
    def pending(self) -> int:
        """Requests let through and not yet queued (being read, parsed, planned)."""
        return max(self.in_flight - self.open_requests(), 0)

    def decide(self, model: str | None, tenant: str) -> Refusal | None:
        waited = self.wait(model, self.pending, tenant)
        if waited is not None and waited > self.bound:
            return Refusal(waited, self.in_flight, self.bound)
        self.let_through()
        return None

    def let_through(self) -> None:
        """Count a request as let through (until `release`), its wait weighed elsewhere."""
        self.in_flight += 1

    async def admit(self, model: str | None, tenant: str, body_bytes: int | None) -> Refusal | None:
        return self.decide(model, tenant)

    def release(self) -> None:
        self.in_flight -= 1


class EdgeAdmission:
    """A request to a model route arriving while the work it would wait on exceeds the bound is
    answered 429 at once (+ Retry-After). It counts its own refusals, which the app's response
    counter never sees."""

    def __init__(self, app: ASGIApp, admitter: EdgeAdmitter, record: ResponseRecorder | None = None) -> None:
        self.app = app
        self.admitter = admitter
        self.record = record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not scope.get("state", {}).get(LET_THROUGH):  # else the HTTP protocol decided: its route ran a model
            runs_a_model, model = model_route(scope)
            if not runs_a_model:
                await self.app(scope, receive, send)
                return
            refusal = await self.admitter.admit(model, tenant_of(scope), declared_length(scope))
            if refusal is not None:
                await self._refuse(send, refusal, scope)
                return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admitter.release()

    async def _refuse(self, send: Send, refusal: Refusal, scope: Scope) -> None:
        status, headers, body = refusal_answer(refusal, scope.get("path", ""))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if self.record is not None:
            self.record("", status, key_name(scope), None)
