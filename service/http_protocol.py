"""uvicorn's HTTP protocol with a deadline on the request line and headers. uvicorn times out an
idle keep-alive connection but not one that sends its headers a byte at a time: such "slow
header" clients would each hold a connection forever. A request whose headers have not all
arrived within `header_timeout` seconds of its first byte (or of the connection) is answered
408 in JSON and the connection closed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout = 10.0  # set from Settings.header_timeout_seconds by service.main.run

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self.header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # an idle keep-alive connection is uvicorn's timeout_keep_alive's

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self.header_deadline = None
        if self.transport.is_closing():
            return
        body = json.dumps(
            {
                "error": {
                    "code": "request_timeout",
                    "message": f"headers not received within {self.header_timeout:g} s",
                    "field": None,
                }
            }
        ).encode()
        head = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        self.transport.write(head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.transport.close()
