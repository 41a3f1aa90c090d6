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
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from nerserve.service.api.errors import ERROR_STATUS
from nerserve.service.metrics import Metrics

# The edge refuses at this share of the bound, the scheduler at the whole of it. Both count about the
# same work against about the same rate; were the edge the more lenient, the flood would be refused
# after it was parsed and planned (measured at 3×: 16,035 of 18,960 refusals at the scheduler,
# goodput 0.76 of capacity, accepted p99 2.5 s).
EDGE_SHARE = 0.8

# The estimate is calibrated by what requests then took (see EdgeAdmission.calibration): it tracks
# the CALIBRATION_QUANTILE of took ÷ promised, stepping by CALIBRATION_STEP (a log-scale step), from
# requests admitted with a calibrated promise of at least CALIBRATION_FROM_SHARE of the bound, within
# CALIBRATION_LIMITS. Only near the bound, where the refusals are decided: behind a short queue the
# time a request takes itself dominates the ratio (learning from promises of 0.1 s and more, the
# calibration rose to 3–4 in bursts at 70 % of capacity and refused 336 requests in a 10-minute soak).
CALIBRATION_QUANTILE = 0.9
CALIBRATION_STEP = 0.05
CALIBRATION_FROM_SHARE = 0.5
CALIBRATION_LIMITS = (0.5, 4.0)


class EdgeAdmission:
    """A POST /extract arriving while the requests in flight would take longer than `bound` seconds
    to complete at the service's capacity is answered 429 at once (+ Retry-After). The scheduler's
    own estimate sees only its queue; requests also wait in the event loop, HTTP parsing and
    planning, which this count includes from arrival to answer. It counts its own refusals, which
    the app's response counter never sees.

    `capacity(requests)` is requests/s from the schedulers' rates measured for the batches that many
    requests would form (0 until one is measured: nothing is refused here then). Not the completion
    rate seen here: below capacity that is the offered load, and read against a burst it promised
    waits up to 1.4× too long (measured: 179 refusals in a 10-minute soak at 70 % of capacity).

    `calibration` scales that estimate by how long admitted requests then took against what it
    promised them: the 90th percentile of took ÷ promised (a stochastic quantile estimate), so
    that the bound holds for nine admitted requests in ten. Requests in flight ÷ capacity leaves
    out what the count cannot see (the batches' composition, the event loop's share of the core
    under a flood of refusals): at 3× capacity, requests took 1.3× the estimate at the median and
    2.3× at p90, so a bound on the estimate was not a bound on the wait (accepted p99 1.6 s
    against an edge bound of 0.6 s)."""

    def __init__(
        self,
        app: ASGIApp,
        bound: float,
        capacity: Callable[[int], float],
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.app = app
        self.bound = bound
        self.capacity = capacity
        self.metrics = metrics
        self.clock = clock
        self.in_flight = 0
        self.calibration = 1.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != "/extract":
            await self.app(scope, receive, send)
            return
        requests = self.in_flight + 1  # those ahead, and itself
        capacity = self.capacity(requests)
        promised = requests / capacity if capacity > 0 else 0.0
        # A request with none ahead is always taken: it can never be served sooner, and the next
        # sample of what requests cost comes only from one that is taken.
        if self.in_flight and self.calibration * promised > self.bound:
            await self._refuse(send, self.calibration * promised)
            return
        self.in_flight += 1
        started = self.clock()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self._calibrate(promised, self.clock() - started)

    def _calibrate(self, promised: float, took: float) -> None:
        if self.calibration * promised < CALIBRATION_FROM_SHARE * self.bound:
            # No queue to learn from: the calibration relaxes towards 1 (the raw estimate), so that
            # a bias learnt in a flood is not held against the next burst after a calm spell.
            # (its logarithm one down-step nearer 0, never past it)
            logged = math.log(self.calibration)
            nearer = max(abs(logged) - CALIBRATION_STEP * (1 - CALIBRATION_QUANTILE), 0.0)
            self.calibration = math.exp(math.copysign(nearer, logged))
            return
        # Up by q steps when a request took longer than the calibrated promise, down by 1 − q when
        # not: the fixed point is where a share 1 − q of requests take longer.
        over = took > self.calibration * promised
        step = CALIBRATION_STEP * (CALIBRATION_QUANTILE if over else CALIBRATION_QUANTILE - 1)
        low, high = CALIBRATION_LIMITS
        self.calibration = min(max(self.calibration * math.exp(step), low), high)

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
