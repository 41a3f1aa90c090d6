"""The HTTP protocol's writes (service.http_protocol.TurnWrites): what a connection writes in one
turn of the event loop reaches its socket in one write, closing sends what was written first, and
nothing is written to a connection already closing. The protocol's deadline, door and edge answers
are tested end to end (tests/test_service.py, tests/test_tenants.py, tests/test_http_workers.py)."""

from __future__ import annotations

import asyncio

from nerserve.service.http_protocol import TurnWrites


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
