"""Texts (or token lists) → entities through one served model: validation that needs the model,
planning, the batcher, assembly. Shared by POST /extract and the KServe v2 infer route.

Planning (sentences, windows, sub-words) and assembly (character offsets) happen where the request
was received; only `start_planned` needs the engine. With HTTP worker processes the workers plan and
assemble, and the engine process receives sub-word units and answers entity sets: its time is
what caps a server's sentences a second, whatever the number of workers."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from nerserve.ner.archs.base import OptionError
from nerserve.ner.text.subword import Tokenized
from nerserve.ner.types import EntitySet
from nerserve.service.api.errors import ApiError
from nerserve.service.api.state import ServiceState, service_state
from nerserve.service.auth import tenant_of
from nerserve.service.batching.work import Answer, DeadlineExceeded, Draining, ItemResult, ModelBroken, QueueFull
from nerserve.service.models import ServedModel
from nerserve.service.pipeline import PlannedText, Planner, TooManySentences, assemble, flatten, keep_labels
from nerserve.service.tenants import retry_after

log = logging.getLogger("nerserve")


@dataclass
class ExtractionQuery:
    """One extraction request, whatever protocol it came in."""

    texts: list[str] | None = None
    tokens: list[list[str]] | None = None
    labels: list[str] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    flat: bool = False
    deadline_ms: float | None = None

    @property
    def where(self) -> str:
        """The request's field of texts, for its errors."""
        return "texts" if self.texts is not None else "tokens"


@dataclass
class Extraction:
    entities: list[list[dict[str, Any]]]  # per text
    queue_seconds: float
    inference_seconds: float


def check_serving(state: ServiceState) -> None:
    if state.draining:
        raise ApiError("draining", "server is shutting down; retry on another replica")
    if not state.ready:
        raise ApiError("not_ready", "models are still loading", headers={"Retry-After": "5"})


def check_tokens(tokens: list[list[str]]) -> None:
    # str.split() splits where str.isspace() holds: a sentence comes back whole from joining and
    # splitting exactly when its tokens are non-empty and hold no whitespace (checked in C; the
    # loop below only for a sentence that fails, to say where)
    for i, sentence in enumerate(tokens):
        if sentence and " ".join(sentence).split() == sentence:
            continue
        if not sentence:
            raise ApiError("invalid_request", f"tokens[{i}]: a sentence needs at least one token", f"tokens[{i}]")
        for j, token in enumerate(sentence):
            if not token or any(c.isspace() for c in token):
                raise ApiError(
                    "invalid_request",
                    f"tokens[{i}][{j}]: tokens must be non-empty and contain no whitespace",
                    f"tokens[{i}][{j}]",
                )


def _label_filter(model: ServedModel, labels: list[str] | None) -> set[str] | None:
    """A closed-label model's output filtered to the labels asked (each must be one of its own);
    an open-label model reads them as its prompt instead."""
    if labels is None or model.spec.capabilities.open_labels:
        return None
    known = set(model.manifest.labels)
    for index, label in enumerate(labels):
        if label not in known:
            raise ApiError(
                "unknown_label",
                f"labels[{index}]: {label!r} is not a label of model {model.name!r} ({', '.join(model.manifest.labels)})",
                f"labels[{index}]",
            )
    return set(labels)


# The scope's extension (service.http_protocol) whose "future" is done once the request's
# connection is lost: the client gone is noticed without a task a request awaiting its disconnect.
CONNECTION_LOST = "nerserve.connection_lost"


async def client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body was read already: the next ASGI message is
    the disconnect). Event-driven, so in-flight requests cost nothing while they wait."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_extraction(request: Request, model: str, query: ExtractionQuery) -> Extraction:
    """A route's extraction, through the engine (in this process or the engine process), watching
    for the client to go away meanwhile (the body is read already). What needs no model is checked
    here, in the HTTP process, before the engine is asked."""
    state = service_state(request)
    inputs = query.texts if query.texts is not None else query.tokens
    assert inputs is not None
    where = query.where
    if len(inputs) > state.settings.max_texts:
        raise ApiError("too_many_texts", f"{where}: {len(inputs)} items, at most {state.settings.max_texts}", where)
    if query.tokens is not None:
        check_tokens(query.tokens)
    tenant = tenant_of(request.scope)
    connection = request.scope.get("extensions", {}).get(CONNECTION_LOST)
    if connection is not None:
        return await state.engine.extract(model, query, tenant, connection["future"])
    gone: asyncio.Future[Any] = asyncio.ensure_future(client_gone(request))  # another server than ours
    try:
        return await state.engine.extract(model, query, tenant, gone)
    finally:
        gone.cancel()


# Planning a few sentences takes less time than handing it to a thread and back (under load the
# hand-offs dominate the event loop); a large request is planned in a thread so that the loop
# keeps answering others meanwhile.
INLINE_PLAN_CHARACTERS = 2_000


async def plan_query(planner: Planner, query: ExtractionQuery, max_sentences: int) -> list[PlannedText]:
    """The request's texts (or token lists) as planned texts: sentences, windows, sub-words; a 413
    where they hold more than MAX_SENTENCES sentences, said before any is tokenised."""
    if query.texts is not None:
        size = sum(len(text) for text in query.texts)
    else:
        size = sum(len(token) + 1 for sentence in query.tokens or [] for token in sentence)
    try:
        if size <= INLINE_PLAN_CHARACTERS:
            return planner.plan(query.texts, query.tokens, max_sentences)
        return await asyncio.to_thread(planner.plan, query.texts, query.tokens, max_sentences)
    except TooManySentences as over:
        raise too_many_sentences(query.where, over.count, max_sentences) from None


def too_many_sentences(where: str, count: int, limit: int) -> ApiError:
    return ApiError(
        "too_many_sentences",
        f"{where}: {count} sentences (long ones count once per window), at most {limit} a request: "
        "send the texts in several requests",
        where,
    )


@dataclass
class PlannedQuery:
    """A request as the engine runs it, planned where it was received: each unit's sentence and
    cost, with the request's labels, options and deadline."""

    units: list[tuple[Tokenized, int]]
    labels: list[str] | None
    options: dict[str, Any]
    deadline_ms: float | None
    where: str  # the request's field of texts ("texts" or "tokens"), for its errors

    @classmethod
    def of(cls, query: ExtractionQuery, planned: list[PlannedText]) -> PlannedQuery:
        units = [(unit.sentence, unit.cost) for text in planned for unit in text.units]
        return cls(units, query.labels, query.options, query.deadline_ms, query.where)

    def __reduce__(self) -> tuple[type[PlannedQuery], tuple[Any, ...]]:
        # pickled as its fields in order (a worker sends one a request, the engine loads it): a
        # dataclass's default pickling writes and reads its __dict__, field names and all
        return (PlannedQuery, (self.units, self.labels, self.options, self.deadline_ms, self.where))


@dataclass
class UnitAnswers:
    """What the engine answers a planned request: an entity set per unit, the labels a closed-label
    model's answer keeps (None: all), and the request's time in the queue and on the graphs."""

    entities: list[EntitySet]
    wanted: set[str] | None
    queue_seconds: float
    inference_seconds: float

    def __reduce__(self) -> tuple[type[UnitAnswers], tuple[Any, ...]]:
        # pickled as its fields in order, as PlannedQuery is: the engine pickles one a request
        return (UnitAnswers, (self.entities, self.wanted, self.queue_seconds, self.inference_seconds))


# what a planned request's run calls once: with its answers, or with the error that ended it
OnDone = Callable[[UnitAnswers | BaseException], None]


class SentenceAnswer:
    """One sentence's slot in its request's run (scheduler.Answer): the batcher answers it, and
    the run hears of it at once, with no future and no turn of the event loop between."""

    __slots__ = ("answered", "index", "run")

    def __init__(self, run: PlannedRun, index: int) -> None:
        self.run = run
        self.index = index
        self.answered = False

    def done(self) -> bool:
        return self.answered or self.run.cancelled

    def set_result(self, result: ItemResult, /) -> None:
        self.answered = True
        self.run._answered(self.index, result)

    def set_exception(self, error: BaseException, /) -> None:
        self.answered = True
        self.run._failed(error)


class PlannedRun:
    """A planned request's sentences in a model's queue, followed by callbacks rather than awaited:
    the engine answers thousands of requests a second, and a task, coroutines and futures a
    request cost its loop more than the request's own bookkeeping. `on_done` gets the request's
    UnitAnswers, or the exception of the first sentence that failed (or the client_gone ApiError once
    `cancel` is called), exactly once; once cancelled, its sentences still queued are dropped."""

    def __init__(self, sentences: int, wanted: set[str] | None, on_done: OnDone) -> None:
        self.wanted = wanted
        self.on_done = on_done
        self.settled = False
        self.cancelled = False
        self._results: list[ItemResult | None] = [None] * sentences
        self._remaining = sentences
        if not sentences:
            self._settle(UnitAnswers([], wanted, 0.0, 0.0))

    def answers(self) -> list[Answer]:
        """Each sentence's slot, for the batcher: a lone sentence's is the run itself (nearly every
        request through HTTP workers: a slot object and its calls cost the engine a microsecond or
        two a request), several sentences' are SentenceAnswers. Not kept here: a slot refers to its
        run and not the reverse, so that an answered request is freed at once rather than by the
        cycle collector, whose full passes, with thousands of requests a second, came as pauses."""
        if len(self._results) == 1:
            return [self]
        return [SentenceAnswer(self, index) for index in range(len(self._results))]

    # The batcher's Answer, for a run of one sentence (its own slot: `answers`).
    def done(self) -> bool:
        return self.settled

    def set_result(self, result: ItemResult, /) -> None:
        if not self.settled:
            self._settle(UnitAnswers([result.value], self.wanted, result.queue_seconds, result.run_seconds))

    def set_exception(self, error: BaseException, /) -> None:
        self._failed(error)

    def _answered(self, index: int, result: ItemResult) -> None:
        """A SentenceAnswer's result: the run settles with its last."""
        self._results[index] = result
        self._remaining -= 1
        if self._remaining or self.settled:
            return
        results = [r for r in self._results if r is not None]
        self._settle(
            UnitAnswers(
                [r.value for r in results],
                self.wanted,
                queue_seconds=max(r.queue_seconds for r in results),
                inference_seconds=sum({r.batch_id: r.run_seconds for r in results}.values()),  # each batch once
            )
        )

    def _failed(self, error: BaseException) -> None:
        if not self.settled:
            self._settle(_api_error(error))

    def cancel(self, _: object = None) -> None:
        """The client went away: its sentences leave the queue (the batcher drops those whose
        answer is done)."""
        if self.settled:
            return
        self.cancelled = True
        # answered to nobody, but counted in /metrics under its own status rather than as a failure
        self._settle(ApiError("client_gone", "the client closed the connection before the answer"))

    def _settle(self, outcome: UnitAnswers | BaseException) -> None:
        self.settled = True
        try:
            self.on_done(outcome)
        except Exception:  # called from the batcher's own loop: one caller's fault must not stop it
            log.exception("a request's answer could not be delivered")


def _api_error(error: BaseException) -> BaseException:
    if isinstance(error, DeadlineExceeded):
        return ApiError("deadline_exceeded", "the request's deadline passed before it ran")
    if isinstance(error, ModelBroken):
        return model_broken(error)
    if isinstance(error, Draining):
        return ApiError("draining", "server is shutting down; retry on another replica")
    return error


def model_broken(error: ModelBroken) -> ApiError:
    return ApiError("model_failed", f"the model stopped working while serving: {error}", "model")


def _enqueue(
    model: ServedModel,
    payloads: list[tuple[Any, int]],
    run: PlannedRun,
    deadline: float | None,
    tenant: str,
    pending: int | None,
) -> None:
    try:
        model.scheduler.enqueue(payloads, run.answers(), deadline, tenant, pending)
    except QueueFull as full:
        raise ApiError(
            "queue_full",
            f"model {model.name!r} is overloaded ({full.depth} sentences queued)",
            headers={"Retry-After": str(int(full.retry_after + 0.999))},
        ) from None
    except Draining:
        raise ApiError("draining", "server is shutting down; retry on another replica") from None
    except ModelBroken as broken:
        raise model_broken(broken) from None


def start_planned(
    state: ServiceState,
    model: ServedModel,
    query: PlannedQuery,
    tenant: str,
    on_done: OnDone,
    pending: int | None = None,
) -> PlannedRun:
    """In the engine's process: the request's checks that need the model or the engine's counts
    (ApiErrors raised here), then its units into the model's batcher; `on_done` follows (see
    PlannedRun). `tenant`, the API key's name ("" without keys); `pending`, for a request not
    weighed at the edge, the requests let through there and not yet queued (Scheduler.enqueue)."""
    wanted = _label_filter(model, query.labels)
    try:
        options = model.resolve_options(query.options, query.labels if wanted is None else None)
    except OptionError as error:
        raise ApiError("invalid_option", str(error), error.field) from None
    deadline = time.monotonic() + query.deadline_ms / 1000 if query.deadline_ms else None
    units = query.units
    if len(units) > state.settings.max_request_sentences:
        raise too_many_sentences(query.where, len(units), state.settings.max_request_sentences)
    over = state.tenants.charge(tenant, len(units))
    if over:
        raise ApiError(
            "key_over_ceiling",
            f"API key {tenant!r} is over its ceiling of {state.tenants.keys[tenant].max_sentences_per_second:g} "
            "sentences a second",
            headers={"Retry-After": retry_after(over)},
        )
    if units and state.tenants.enabled:
        on_done = _counting_key_sentences(state, tenant, len(units), on_done)
    run = PlannedRun(len(units), wanted, on_done)
    if units:
        _enqueue(model, [((sentence, options), cost) for sentence, cost in units], run, deadline, tenant, pending)
    return run


def _counting_key_sentences(state: ServiceState, tenant: str, sentences: int, on_done: OnDone) -> OnDone:
    def counted(outcome: UnitAnswers | BaseException) -> None:
        if isinstance(outcome, UnitAnswers):
            state.metrics.key_sentences.labels(tenant).inc(sentences)
        on_done(outcome)

    return counted


async def settled(start: Callable[[OnDone], PlannedRun], gone: asyncio.Future[Any]) -> UnitAnswers:
    """A planned request started by `start(on_done)`, awaited: its answers, or its error raised; if
    the client goes away first (`gone` done), or the awaiting task is cancelled, its sentences
    leave the queue."""
    outcome: asyncio.Future[UnitAnswers | BaseException] = asyncio.get_running_loop().create_future()

    def answered(value: UnitAnswers | BaseException) -> None:
        if not outcome.done():  # cancelled with the awaiting task
            outcome.set_result(value)

    run = start(answered)
    gone.add_done_callback(run.cancel)
    try:
        result = await outcome
    except asyncio.CancelledError:
        run.cancel()
        raise
    finally:
        gone.remove_done_callback(run.cancel)
    if isinstance(result, BaseException):
        raise result
    return result


def answer(query: ExtractionQuery, planned: list[PlannedText], answers: UnitAnswers) -> Extraction:
    """The units' entity sets → each text's entities with character offsets, where the request was
    planned."""
    found = iter(answers.entities)  # the units' sets in the order the texts' units were sent
    entities = []
    for text in planned:
        assembled = assemble(text, list(itertools.islice(found, len(text.units))))
        assembled = keep_labels(assembled, answers.wanted) if answers.wanted is not None else assembled
        entities.append(flatten(assembled) if query.flat else assembled)
    return Extraction(entities, answers.queue_seconds, answers.inference_seconds)


async def extract(
    state: ServiceState, model: ServedModel, query: ExtractionQuery, tenant: str, gone: asyncio.Future[Any]
) -> Extraction:
    """A request planned, run and assembled in the engine's own process (one HTTP front)."""
    planned = await plan_query(model.planner, query, state.settings.max_request_sentences)
    planned_query = PlannedQuery.of(query, planned)
    answers = await settled(lambda on_done: start_planned(state, model, planned_query, tenant, on_done), gone)
    return answer(query, planned, answers)
