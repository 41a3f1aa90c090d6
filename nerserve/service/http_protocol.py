"""uvicorn's HTTP protocol with a deadline on the request line and headers, and the API-key door
applied as soon as the headers are parsed. uvicorn times out an idle keep-alive connection but
not one that sends its headers a byte at a time: such "slow header" clients would each hold a
connection forever. A request whose headers have not all arrived within `header_timeout` seconds
of its first byte (or of the connection) is answered 408 in JSON and the connection closed. A
request the door refuses is answered 401 in the same callback, before its body is read and
without an ASGI task (which would wait its turn behind the answers the event loop is writing)."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from nerserve.service.api.errors import error_body
from nerserve.service.auth import CHALLENGE, Door
from nerserve.service.metrics import ResponseRecorder


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout = 10.0  # set from Settings.header_timeout_seconds by service.server
    record: ResponseRecorder | None = None  # the app's, set by service.server: a 408 is counted like any response
    door: Door | None = None  # the app's API-key door, set by service.server

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One timer per connection, not one per request: a request only notes when its headers
        # began (arming and cancelling a timer per request costs the event loop more than the
        # request's parsing). The timer checks that note when it fires and re-arms itself.
        self.headers_since: float | None = None
        self.header_check: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.headers_since = self.loop.time()
        self.header_check = self.loop.call_later(self.header_timeout, self._check_headers)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.headers_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self.headers_since = None
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        why = self.door.check(cycle.scope) if self.door is not None else None  # type: ignore[arg-type]
        if why is None:
            super()._start_asgi_task(cycle, app)
            return
        body = self.door.refusal(why, cycle.scope["path"])  # type: ignore[union-attr]
        head = [b"HTTP/1.1 401 Unauthorized", b"content-type: application/json", b"content-length: %d" % len(body)]
        head.append(b"%s: %s" % CHALLENGE)
        if not cycle.keep_alive:
            head.append(b"connection: close")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        cycle.response_complete = True  # the body, if any, is read and dropped
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.headers_since = None  # an idle keep-alive connection is uvicorn's timeout_keep_alive's

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_check is not None:
            self.header_check.cancel()
            self.header_check = None
        super().connection_lost(exc)

    def _check_headers(self) -> None:
        since = self.headers_since
        waited = 0.0 if since is None else self.loop.time() - since
        if since is not None and waited >= self.header_timeout:
            self.header_check = None
            self._headers_too_slow()
            return
        self.header_check = self.loop.call_later(self.header_timeout - waited, self._check_headers)

    def _headers_too_slow(self) -> None:
        if self.transport.is_closing():
            return
        body = error_body("request_timeout", f"headers not received within {self.header_timeout:g} s")
        head = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        self.transport.write(head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.transport.close()
        record = type(self).record  # through the class: a plain function stored there is not bound
        if record is not None:
            record("", 408, None, None)
