"""The HTTP protocol (service.http_protocol): what a connection writes in one turn of the event loop
reaches its socket in one write (TurnWrites), closing sends what was written first, and nothing is
written to a connection already closing; a request's connection tells it when it is lost, a large
body notwithstanding. The protocol's deadline, door and edge answers are tested end to end
(tests/test_service.py, tests/test_tenants.py, tests/test_http_workers.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from nerserve.service.api.extraction import CONNECTION_LOST
from nerserve.service.http_protocol import HeaderDeadlineProtocol, TurnWrites


class Socket(asyncio.Transport):
    """A connection's transport, recording its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)


def test_a_turns_writes_reach_the_socket_as_one() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes]]:
        socket = Socket()
        writes = TurnWrites(socket, asyncio.get_running_loop())
        writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        writes.write(b"{}")
        during = list(socket.writes)
        await asyncio.sleep(0)  # the turn ends
        return during, socket.writes

    during, after = asyncio.run(scenario())
    assert during == [] and after == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


def test_closing_sends_what_was_written_first_and_nothing_after() -> None:
    async def scenario() -> tuple[list[bytes], bool]:
        socket = Socket()
        writes = TurnWrites(socket, asyncio.get_running_loop())
        writes.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        writes.close()
        writes.write(b"late")
        await asyncio.sleep(0)
        return socket.writes, socket.closed

    sent, closed = asyncio.run(scenario())
    assert sent == [b"HTTP/1.1 408 Request Timeout\r\n\r\n"] and closed


def test_aborting_drops_what_was_not_sent() -> None:
    async def scenario() -> list[bytes]:
        socket = Socket()
        socket.abort = socket.close  # type: ignore[method-assign]
        writes = TurnWrites(socket, asyncio.get_running_loop())
        writes.write(b"partial")
        writes.abort()
        await asyncio.sleep(0)
        return socket.writes

    assert asyncio.run(scenario()) == []


def test_a_request_learns_its_connection_is_lost_after_a_large_body() -> None:
    """The request reads its whole body, then waits on its connection's `lost` (as an extraction
    does) and no longer on the ASGI receive. Its body's last part arrives at once and over
    uvicorn's high-water mark, which pauses reading: the protocol reads on once the body is
    complete, so the client's hanging up reaches the request."""
    body = b"x" * 200_000

    async def scenario() -> tuple[bool, bool, bool]:
        seen: dict[str, Any] = {}

        async def app(scope: Any, receive: Any, send: Any) -> None:
            received = b""
            while True:
                message = await receive()
                received += message.get("body", b"")
                if not message.get("more_body"):
                    break
            seen["body"] = received
            seen["lost"] = scope["extensions"][CONNECTION_LOST]["future"]
            await seen["lost"]

        config = uvicorn.Config(app, lifespan="off", log_level="warning")
        config.load()
        protocol = HeaderDeadlineProtocol(config=config, server_state=ServerState(), app_state={})
        socket = Socket()
        protocol.connection_made(socket)
        head = b"POST /extract HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
        protocol.data_received(head + body[:1000])
        for _ in range(5):
            await asyncio.sleep(0)  # the request reads the first part and awaits the rest
        protocol.data_received(body[1000:])
        for _ in range(5):
            await asyncio.sleep(0)
        whole, reading = seen.get("body") == body, socket.reading
        protocol.connection_lost(None)  # what the event loop calls once reading sees the hang-up
        await asyncio.sleep(0)
        return whole, reading, seen["lost"].done()

    assert asyncio.run(scenario()) == (True, True, True)
