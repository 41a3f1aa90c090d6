"""Admission at the HTTP edge: refuse at arrival, before a body is read, what could not be answered
within the bound, and do it cheaply (two raw ASGI messages, outside FastAPI's middleware stack).

The scheduler (service.batching.scheduler) refuses precisely, sentence by sentence, once a request
is parsed and planned; this refuses the flood before that work is spent: at 3× capacity two
requests in three are refused, and what a refusal costs is taken from the graphs that share the
core (measured: the event loop's share of the core rose from 11 % to 22 % at 3× load).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from nerserve.service.api.errors import ERROR_STATUS
from nerserve.service.metrics import Metrics

# The edge refuses at this share of the bound, the scheduler at the whole of it. Both count about the
# same work against about the same rate; were the edge the more lenient, the flood would be refused
# after it was parsed and planned (measured at 3×: 16,035 of 18,960 refusals at the scheduler,
# goodput 0.76 of capacity, accepted p99 2.5 s).
EDGE_SHARE = 0.8


class EdgeAdmission:
    """A POST /extract arriving while the requests in flight would take longer than `bound` seconds
    to complete at the service's capacity is answered 429 at once (+ Retry-After). The scheduler's
    own estimate sees only its queue; requests also wait in the event loop, HTTP parsing and
    planning, which this count includes from arrival to answer. It counts its own refusals, which
    the app's response counter never sees.

    `capacity()` is requests/s from the schedulers' measured rates (0 until one is measured:
    nothing is refused here then). Not the completion rate seen here: below capacity that is the
    offered load, and read against a burst it promised waits up to 1.4× too long (measured: 179
    refusals in a 10-minute soak at 70 % of capacity)."""

    def __init__(self, app: ASGIApp, bound: float, capacity: Callable[[], float], metrics: Metrics | None = None) -> None:
        self.app = app
        self.bound = bound
        self.capacity = capacity
        self.metrics = metrics
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != "/extract":
            await self.app(scope, receive, send)
            return
        capacity = self.capacity()
        if capacity > 0 and self.in_flight / capacity > self.bound:
            await self._refuse(send, self.in_flight / capacity)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _refuse(self, send: Send, wait: float) -> None:
        message = f"overloaded: {self.in_flight} requests in flight, about {wait:.1f} s of work queued"
        body = json.dumps({"error": {"code": "queue_full", "message": message, "field": None}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(max(1, math.ceil(wait - self.bound))).encode()),
        ]
        await send({"type": "http.response.start", "status": ERROR_STATUS["queue_full"], "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if self.metrics is not None:
            self.metrics.requests.labels("", str(ERROR_STATUS["queue_full"])).inc()
