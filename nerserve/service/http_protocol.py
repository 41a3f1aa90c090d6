"""uvicorn's HTTP protocol with a deadline on the request line and headers, and the API-key door
applied as soon as the headers are parsed. uvicorn times out an idle keep-alive connection but
not one that sends its headers a byte at a time: such "slow header" clients would each hold a
connection forever. A request whose headers have not all arrived within `header_timeout` seconds
of its first byte (or of the connection) is answered 408 in JSON and the connection closed. A
request the door refuses is answered 401 in the same callback, before its body is read and
without an ASGI task (which would wait its turn behind the answers the event loop is writing).
Where the engine shares this process, a request to a model route that the edge admission refuses
is answered 429 the same way, for the same reason: under overload most requests are refused, and a
refusal's task would wait its turn behind the answers the event loop is writing
(docs/decisions/admission.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from nerserve.service.admission import LET_THROUGH, EdgeCounter, Refusal, model_route, refusal_answer
from nerserve.service.api.errors import error_body
from nerserve.service.api.extraction import CONNECTION_LOST
from nerserve.service.auth import CHALLENGE, Door, key_name, tenant_of
from nerserve.service.logs import log_access
from nerserve.service.metrics import ResponseRecorder
from nerserve.service.request_ids import new_request_id, request_id_header, request_id_of, trace_id_of


class TurnWrites(asyncio.Transport):
    """A connection's writes of one turn of the event loop, sent as one. uvicorn writes a response's
    head as the application starts it and its body after: two system calls a response and, at the
    client, two reads (on a network, two segments) for one small answer."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.transport = transport
        self.loop = loop
        self.pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.pending:
            self.loop.call_soon(self.flush)
        self.pending.append(bytes(data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        if not self.pending:
            return
        data, self.pending = b"".join(self.pending), []
        if not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def abort(self) -> None:
        self.pending = []
        self.transport.abort()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + sum(map(len, self.pending))

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.transport.get_write_buffer_limits()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.transport.get_protocol()

    def is_reading(self) -> bool:
        return self.transport.is_reading()

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout = 10.0  # set from Settings.header_timeout_seconds by service.server
    record: ResponseRecorder | None = None  # the app's, set by service.server: a 408 is counted like any response
    door: Door | None = None  # the app's API-key door, set by service.server
    # the engine's edge counter where the engine shares this process and no CORS headers are owed
    # (a 429 written here passes no middleware), set by service.server
    edge: EdgeCounter | None = None
    logs_access = False  # Settings.access_log, set by service.server (uvicorn's protocol has its own `access_log`)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One timer per connection, not one per request: a request only notes when its headers
        # began (arming and cancelling a timer per request costs the event loop more than the
        # request's parsing). The timer checks that note when it fires and re-arms itself.
        self.headers_since: float | None = None
        self.header_check: asyncio.TimerHandle | None = None
        # done once the connection is lost: what a request's extraction watches for its client gone
        # (api.extraction.CONNECTION_LOST; a connection's requests come one after another), which
        # spares a task a request awaiting the ASGI disconnect
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self.lost_extension = {"future": self.lost}  # an ASGI extension is a dict; one a connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(TurnWrites(transport, self.loop))
        self.headers_since = self.loop.time()
        self.header_check = self.loop.call_later(self.header_timeout, self._check_headers)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.headers_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self.headers_since = None
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        scope: Any = cycle.scope
        why = self.door.check(scope) if self.door is not None else None
        if why is not None:
            body = self.door.refusal(why, scope["path"])  # type: ignore[union-attr]
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), CHALLENGE]
            self._answer(cycle, 401, headers, body)
            return
        refusal = self._edge_refusal(scope)
        if refusal is not None:
            status, headers, body = refusal_answer(refusal, scope["path"])
            self._answer(cycle, status, headers, body)
            record = type(self).record  # through the class: a plain function stored there is not bound
            if record is not None:
                record("", status, key_name(scope), None)
            return
        scope.setdefault("extensions", {})[CONNECTION_LOST] = self.lost_extension
        super()._start_asgi_task(cycle, app)

    def _edge_refusal(self, scope: Any) -> Refusal | None:
        """The edge admission's decision on a request to a model route; one let through is marked
        so, counted until the app has answered it (`EdgeAdmission` releases it)."""
        if self.edge is None:
            return None
        runs_a_model, model = model_route(scope)
        if not runs_a_model:
            return None
        refusal = self.edge.decide(model, tenant_of(scope))
        if refusal is None:
            scope.setdefault("state", {})[LET_THROUGH] = True
        return refusal

    def _answer(self, cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole response in one write, without an ASGI task, with the request's id (logged where
        the access log is on); the request's body, if any, is read and dropped."""
        scope: Any = cycle.scope
        headers = [*headers, request_id_header(scope)]
        head = [b"HTTP/1.1 %d %s" % (status, HTTPStatus(status).phrase.encode()), *(b"%s: %s" % header for header in headers)]
        if not cycle.keep_alive:
            head.append(b"connection: close")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        cycle.response_complete = True
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()
        if self.logs_access:
            key, request_id, trace = key_name(scope), request_id_of(scope), trace_id_of(scope)
            log_access(scope["method"], scope["path"], status, 0.0, "", key, request_id, trace)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The whole body is in: reading goes on, so that the connection's loss is seen while the
        # answer is made (`lost`). uvicorn pauses reading while an unread body passes its high-water
        # mark and resumes it when the application next awaits its ASGI receive, which a request
        # watching `lost` no longer does. A pipelined request's headers pause it again.
        self.flow.resume_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.headers_since = None  # an idle keep-alive connection is uvicorn's timeout_keep_alive's

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_check is not None:
            self.header_check.cancel()
            self.header_check = None
        super().connection_lost(exc)
        if not self.lost.done():
            self.lost.set_result(None)

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
        request_id = new_request_id()
        head = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        head += b"x-request-id: " + request_id.encode() + b"\r\n"
        self.transport.write(head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.transport.close()
        record = type(self).record  # through the class: a plain function stored there is not bound
        if record is not None:
            record("", 408, None, None)
        if self.logs_access:
            log_access("-", "-", 408, self.header_timeout, "", None, request_id)
