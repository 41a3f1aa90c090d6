"""A request's id: the one its client (or a proxy in front: an ingress, a load balancer) sent in
`X-Request-Id`, or one made here. Every response carries it back in the same header, and the log
lines about the request (the access log, an unexpected error) name it, so that one request can be
followed from the client through the proxies to this server's logs. Where a request carries a W3C
`traceparent` (a traced client, or a mesh's sidecar), its access line names its trace too, so that
a trace's spans find the line."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nerserve.service.auth import key_name
from nerserve.service.logs import log_access

REQUEST_ID_HEADER = b"x-request-id"
# what a client's id may be: visible ASCII, no spaces, short enough for a log line; anything else
# (a header too long, or one that could break a log line or a JSON log's reader) is replaced
WELL_FORMED = re.compile(rb"[!-~]{1,128}")
# where a request's id is kept in its ASGI scope, once made
REQUEST_ID = "request_id"
TRACEPARENT_HEADER = b"traceparent"
# W3C Trace Context: version, trace id, parent span id, flags (version ff is not one)
TRACEPARENT = re.compile(rb"(?!ff)[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}(?:-.*)?")
NO_TRACE = "0" * 32


def new_request_id() -> str:
    """64 random bits in hex: unique enough for the requests a log holds."""
    return os.urandom(8).hex()


def request_id_of(scope: Any) -> str:
    """SCOPE's request id: the one kept in its state, else the client's (if well formed) or a new
    one, kept there for the rest of the request's way through the server."""
    state = scope.setdefault("state", {})
    kept = state.get(REQUEST_ID)
    if kept is not None:
        return str(kept)
    chosen = None
    for name, value in scope.get("headers") or ():
        if name == REQUEST_ID_HEADER:
            chosen = value.decode("ascii") if WELL_FORMED.fullmatch(value) else None
            break
    state[REQUEST_ID] = chosen = chosen or new_request_id()
    return chosen


def request_id_header(scope: Any) -> tuple[bytes, bytes]:
    return REQUEST_ID_HEADER, request_id_of(scope).encode("ascii")


def trace_id_of(scope: Any) -> str | None:
    """The trace id of SCOPE's `traceparent`, if it has a valid one."""
    for name, value in scope.get("headers") or ():
        if name == TRACEPARENT_HEADER:
            parsed = TRACEPARENT.fullmatch(value.strip().lower())
            trace = parsed[1].decode("ascii") if parsed else None
            return trace if trace != NO_TRACE else None
    return None


class RequestIds:
    """Outermost in the served application: every response it makes carries its request's id, and
    where the access log is on, each gets its line (status, time, model, API key's name, id).
    Answers the HTTP protocol writes itself (a 401 or 429 before the body is read, a 408) take
    theirs there (service.http_protocol)."""

    def __init__(self, app: ASGIApp, access_log: bool = False) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        id_header = (REQUEST_ID_HEADER, request_id.encode("ascii"))
        status, started = 500, time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message = {**message, "headers": [*message.get("headers", ()), id_header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log:
                seconds, model = time.perf_counter() - started, str(scope.get("state", {}).get("model", ""))
                key, trace = key_name(scope), trace_id_of(scope)
                log_access(scope["method"], scope["path"], status, seconds, model, key, request_id, trace)
