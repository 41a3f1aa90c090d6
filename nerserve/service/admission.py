"""Admission at the HTTP edge: refuse at arrival, before a body is read, what could not be answered
within the bound, and do it cheaply (two raw ASGI messages, outside FastAPI's middleware stack), on
every route that runs a model (POST /extract, POST /v2/models/{name}[/versions/{v}]/infer).

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

from starlette.types import ASGIApp, Receive, Scope, Send

from nerserve.service.api.errors import ERROR_STATUS, error_body
from nerserve.service.auth import tenant_of
from nerserve.service.metrics import Metrics

V2_INFER = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?/infer$")

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


class EdgeAdmission:
    """A request to a model route arriving while the work it would wait on exceeds `bound` seconds
    is answered 429 at once (+ Retry-After). It counts its own refusals, which the app's response
    counter never sees."""

    def __init__(
        self, app: ASGIApp, bound: float, wait: WaitEstimate, open_requests: Callable[[], int], metrics: Metrics | None = None
    ) -> None:
        self.app = app
        self.bound = bound
        self.wait = wait
        self.open_requests = open_requests  # requests the schedulers hold (queued or running)
        self.metrics = metrics
        self.in_flight = 0  # requests let through here and not yet answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runs_a_model, model = model_route(scope)
        if not runs_a_model:
            await self.app(scope, receive, send)
            return
        pending = max(self.in_flight - self.open_requests(), 0)
        tenant = tenant_of(scope)
        waited = self.wait(model, pending, tenant)
        if waited is not None and waited > self.bound:
            await self._refuse(send, waited, scope)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _refuse(self, send: Send, wait: float, scope: Scope) -> None:
        message = f"overloaded: {self.in_flight} requests in flight, about {wait:.1f} s of work ahead"
        body = error_body("queue_full", message, path=scope.get("path", ""))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(max(1, math.ceil(wait - self.bound))).encode()),
        ]
        await send({"type": "http.response.start", "status": ERROR_STATUS["queue_full"], "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if self.metrics is not None:
            self.metrics.requests.labels("", str(ERROR_STATUS["queue_full"])).inc()
            if "tenant" in scope.get("state", {}):
                self.metrics.key_requests.labels(tenant_of(scope), str(ERROR_STATUS["queue_full"])).inc()
