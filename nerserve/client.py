"""A typed client of a nerserve server (`pip install nerserve[client]`): sync `Client` and async
`AsyncClient` over httpx. A 429 or 503 is retried after the server's `Retry-After` (bounded by
`max_retries`, `max_wait`), and so is a proxy's 500/502/504 in front of a server that died with
the request in flight (extraction is idempotent); long lists of documents are sent in batches of `batch_size`, and
`extract_stream` yields results as each batch comes back, so a million documents never sit in
one request or one list.

    from nerserve.client import Client
    with Client("http://127.0.0.1:8000") as ner:
        for entity in ner.extract(["EU rejects German call."], model="span-conll03")[0]:
            print(entity.type, entity.text, entity.start, entity.end)
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

import httpx
from pydantic import BaseModel

RETRIED = (429, 503)  # the server says when to come back
PROXY_FAILURES = (500, 502, 504)  # retried only when the answer is not nerserve's own JSON error


def _retryable(response: httpx.Response) -> bool:
    """429/503, or a proxy's failure in front of nerserve (a Ray Serve replica or a pod that died
    with the request in flight): extraction is idempotent, so sending it again is safe."""
    if response.status_code in RETRIED:
        return True
    if response.status_code not in PROXY_FAILURES:
        return False
    try:
        return "error" not in response.json()
    except ValueError:
        return True


class Entity(BaseModel):
    type: str
    text: str
    score: float
    start: int  # the whole extent, characters [start, end)
    end: int
    spans: list[tuple[int, int]]  # one per fragment (discontinuous entities have several)
    token_spans: list[tuple[int, int]]


class NerServeError(Exception):
    """The server's JSON error: its HTTP status, code, message, the field it names, and the
    request's id (`X-Request-Id`), which the server's logs name too."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, request_id: str | None = None) -> None:
        named = f" (request id {request_id})" if request_id and request_id not in message else ""
        super().__init__(f"{status} {code}: {message}{named}")
        self.status, self.code, self.message, self.field = status, code, message, field
        self.request_id = request_id

    @classmethod
    def of(cls, response: httpx.Response) -> NerServeError:
        request_id = response.headers.get("x-request-id")
        try:
            error = response.json()["error"]
            code, message = error.get("code", ""), error.get("message", "")
            return cls(response.status_code, code, message, error.get("field"), request_id)
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(response.status_code, "http_error", response.text[:200], request_id=request_id)


Document = str | Sequence[str]  # a raw text, or one sentence's words (sent as `tokens`)


def _payload(
    documents: list[Document], model: str | None, labels: list[str] | None, options: dict[str, Any] | None, flat: bool
) -> dict[str, Any]:
    payload: dict[str, Any]
    if all(isinstance(d, str) for d in documents):
        payload = {"texts": documents}
    elif not any(isinstance(d, str) for d in documents):
        payload = {"tokens": [list(d) for d in documents]}
    else:
        raise ValueError("one call mixes raw texts and word lists: send each kind in its own call")
    if model:
        payload["model"] = model
    if labels is not None:
        payload["labels"] = labels
    if options:
        payload["options"] = options
    if flat:
        payload["flat"] = True
    return payload


def _checked(response: httpx.Response | None, retries: _Retries) -> httpx.Response:
    """The answer, or NerServeError: the server's error, or why it could not be reached."""
    if response is None:
        raise NerServeError(0, "unreachable", retries.unreachable())
    if response.status_code != 200:
        raise NerServeError.of(response)
    return response


def _retry_after(response: httpx.Response | None, attempt: int) -> float:
    """The server's Retry-After (seconds), else exponential back-off from 0.5 s."""
    header = response.headers.get("retry-after", "") if response is not None else ""
    return float(header) if header.replace(".", "", 1).isdigit() else 0.5 * 2**attempt


class _Retries:
    """One request's retry budget: after each answer (None: the connection failed), how long to
    wait before trying again, or None to stop there."""

    def __init__(self, max_retries: int, max_wait: float, url: httpx.URL) -> None:
        self.max_retries, self.max_wait, self.url = max_retries, max_wait, url
        self.attempt, self.waited = 0, 0.0
        self.failure: Exception | None = None  # why the last try got no answer, if it got none

    def unreachable(self) -> str:
        """Why the last try got no answer, and after how many tries."""
        return (
            f"{self.url} could not be reached ({self.attempt + 1} tries over {self.waited:.1f} s): "
            f"{type(self.failure).__name__}: {self.failure}"
        )

    def pause(self, response: httpx.Response | None) -> float | None:
        if response is not None and not _retryable(response):
            return None
        pause = _retry_after(response, self.attempt)
        if self.attempt >= self.max_retries or self.waited + pause > self.max_wait:
            return None
        self.attempt, self.waited = self.attempt + 1, self.waited + pause
        return pause


def _entities(response: httpx.Response) -> list[list[Entity]]:
    return [[Entity.model_validate(e) for e in result["entities"]] for result in response.json()["results"]]


def _batches(documents: Iterable[Document], size: int) -> Iterator[list[Document]]:
    batch: list[Document] = []
    for document in documents:
        batch.append(document)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


API_KEY_VARIABLE = "NERSERVE_API_KEY"


def _auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get(API_KEY_VARIABLE)
    return {"authorization": f"Bearer {key}"} if key else {}


class Client:
    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 60.0,
        max_retries: int = 5,
        max_wait: float = 30.0,
        batch_size: int = 64,
        api_key: str | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        """`api_key`: sent as `Authorization: Bearer <key>` (default: the NERSERVE_API_KEY
        environment variable, when set)."""
        self.http = http or httpx.Client(base_url=url, timeout=timeout, headers=_auth_headers(api_key))
        self.max_retries, self.max_wait, self.batch_size = max_retries, max_wait, batch_size

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _post(self, payload: dict[str, Any]) -> httpx.Response:
        retries = _Retries(self.max_retries, self.max_wait, self.http.base_url)
        while True:
            try:
                response: httpx.Response | None = self.http.post("/extract", json=payload)
            except httpx.TransportError as error:  # connection refused or reset: the server went away
                response, retries.failure = None, error
            pause = retries.pause(response)
            if pause is None:
                return _checked(response, retries)
            time.sleep(pause)

    def extract(
        self,
        texts: Iterable[Document],
        model: str | None = None,
        *,
        labels: list[str] | None = None,
        options: dict[str, Any] | None = None,
        flat: bool = False,
    ) -> list[list[Entity]]:
        """Entities of each text, in order (sent in batches of `batch_size`). A text is a raw string, or
        a sentence already split into words (sent as `tokens`; offsets then index the words joined
        by single spaces)."""
        return list(self.extract_stream(texts, model, labels=labels, options=options, flat=flat))

    def extract_stream(
        self,
        texts: Iterable[Document],
        model: str | None = None,
        *,
        labels: list[str] | None = None,
        options: dict[str, Any] | None = None,
        flat: bool = False,
    ) -> Iterator[list[Entity]]:
        """One list of entities per text, as each batch is answered; `texts` may be a generator."""
        for batch in _batches(texts, self.batch_size):
            yield from _entities(self._post(_payload(batch, model, labels, options, flat)))

    def models(self) -> list[dict[str, Any]]:
        response = self.http.get("/models")
        if response.status_code != 200:
            raise NerServeError.of(response)
        models: list[dict[str, Any]] = response.json()["models"]
        return models

    def ready(self) -> bool:
        try:
            return self.http.get("/health/ready").status_code == 200
        except httpx.TransportError:
            return False


class AsyncClient:
    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        timeout: float = 60.0,
        max_retries: int = 5,
        max_wait: float = 30.0,
        batch_size: int = 64,
        concurrency: int = 4,
        api_key: str | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """`api_key`: as for Client."""
        self.http = http or httpx.AsyncClient(base_url=url, timeout=timeout, headers=_auth_headers(api_key))
        self.max_retries, self.max_wait, self.batch_size = max_retries, max_wait, batch_size
        self.concurrency = concurrency  # batches in flight at once

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _post(self, payload: dict[str, Any]) -> httpx.Response:
        retries = _Retries(self.max_retries, self.max_wait, self.http.base_url)
        while True:
            try:
                response: httpx.Response | None = await self.http.post("/extract", json=payload)
            except httpx.TransportError as error:
                response, retries.failure = None, error
            pause = retries.pause(response)
            if pause is None:
                return _checked(response, retries)
            await asyncio.sleep(pause)

    async def extract(
        self,
        texts: Iterable[Document],
        model: str | None = None,
        *,
        labels: list[str] | None = None,
        options: dict[str, Any] | None = None,
        flat: bool = False,
    ) -> list[list[Entity]]:
        return [found async for found in self.extract_stream(texts, model, labels=labels, options=options, flat=flat)]

    async def extract_stream(
        self,
        texts: Iterable[Document],
        model: str | None = None,
        *,
        labels: list[str] | None = None,
        options: dict[str, Any] | None = None,
        flat: bool = False,
    ) -> AsyncIterator[list[Entity]]:
        """Results in input order, with up to `concurrency` batches in flight."""
        pending: list[asyncio.Task[httpx.Response]] = []
        for batch in _batches(texts, self.batch_size):
            pending.append(asyncio.create_task(self._post(_payload(batch, model, labels, options, flat))))
            if len(pending) >= self.concurrency:
                for found in _entities(await pending.pop(0)):
                    yield found
        for task in pending:
            for found in _entities(await task):
                yield found
