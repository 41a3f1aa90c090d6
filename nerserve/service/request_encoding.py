"""Request bodies sent compressed (`Content-Encoding: gzip` or `deflate`, as Triton's HTTP client
sends them with `request_compression_algorithm`, and as clients batching many texts may) are
decompressed before anything reads them, so that every route, lane and limit sees the JSON or
tensors as sent. The body limit holds for the body decompressed (a small compressed body can hold
a great deal), and the compressed one may be no larger. An encoding the service cannot read is a
415 naming it; a body that does not decompress, a 400 saying why. Answers are not compressed: a
client that asks (`Accept-Encoding`) gets the identity encoding, which HTTP always allows."""

from __future__ import annotations

import asyncio
import functools
import zlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nerserve.service.api.errors import ApiError, error_response
from nerserve.service.api.lanes import replaying, whole_body

# zlib's window bits: gzip's header, and deflate as HTTP names it (the zlib format)
DECODERS: dict[bytes, int] = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
IDENTITY = b"identity"
# bodies past this size decompress off the event loop, which the worker's other requests share
INLINE_BYTES = 64 * 1024


class RequestEncoding:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        encoding = _content_encoding(scope) if scope["type"] == "http" else None
        if encoding is None:  # nearly every request
            await self.app(scope, receive, send)
            return
        try:
            codings = codings_of(encoding)
            received = await whole_body(receive, self.limit)
            gone = received[-1]["type"] != "http.request"  # the client went while sending
            decoded = b"" if gone else await self._decoded(b"".join(m.get("body", b"") for m in received), codings)
        except ApiError as refused:
            await error_response(refused.code, refused.message, refused.field, path=scope["path"])(scope, receive, send)
            return
        if gone:  # the app sees it as it always has
            await self.app(scope, replaying(received, receive), send)
            return
        await self.app(_as_sent_plain(scope, len(decoded)), replaying([_body_message(decoded)], receive), send)

    async def _decoded(self, body: bytes, codings: list[int]) -> bytes:
        decode = functools.partial(decompressed, body, codings, self.limit)
        return decode() if len(body) <= INLINE_BYTES else await asyncio.to_thread(decode)


def _content_encoding(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"content-encoding":
            value = value.strip().lower()
            return None if value in (b"", IDENTITY) else value
    return None


def codings_of(encoding: bytes) -> list[int]:
    """The header's codings, in the order they were applied, as zlib window bits (identity dropped)."""
    codings = []
    for coding in (part.strip() for part in encoding.split(b",")):
        if coding == IDENTITY:
            continue
        if coding not in DECODERS:
            named = coding.decode("latin-1")
            message = f"Content-Encoding {named!r} is not supported: send the body as it is, or gzip or deflate it"
            raise ApiError("unsupported_media_type", message, "content-encoding")
        codings.append(DECODERS[coding])
    return codings


def decompressed(body: bytes, codings: list[int], limit: int) -> bytes:
    """BODY with its codings undone, last applied first; never more than LIMIT bytes are made."""
    for window_bits in reversed(codings):
        body = _undone(body, window_bits, limit)
    return body


def _undone(body: bytes, window_bits: int, limit: int) -> bytes:
    """One coding undone; gzip data may be several members one after another (RFC 1952), each its own."""
    kind = "gzip" if window_bits > zlib.MAX_WBITS else "deflate"
    parts: list[bytes] = []
    made = 0
    rest = body
    while True:
        decoder = zlib.decompressobj(window_bits)
        try:
            part = decoder.decompress(rest, limit + 1 - made)
        except zlib.error as error:
            raise ApiError("malformed_body", f"request body is not valid {kind} data ({error})") from None
        made += len(part)
        if made > limit or decoder.unconsumed_tail:
            raise ApiError("payload_too_large", f"request body over {limit} bytes once decompressed")
        if not decoder.eof:
            raise ApiError("malformed_body", f"request body ends before its {kind} data does")
        parts.append(part)
        rest = decoder.unused_data
        if not rest or kind == "deflate":
            return b"".join(parts)


def _as_sent_plain(scope: Scope, length: int) -> Scope:
    """SCOPE as if the body of LENGTH bytes had been sent uncompressed."""
    headers = [(name, value) for name, value in scope["headers"] if name not in (b"content-encoding", b"content-length")]
    headers.append((b"content-length", str(length).encode()))
    return {**scope, "headers": headers}


def _body_message(body: bytes) -> Message:
    return {"type": "http.request", "body": body, "more_body": False}
