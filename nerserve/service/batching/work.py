"""What passes through the batcher: a queued sentence (its work item and where its answer goes),
a prepared batch, a finished batch's record for the metrics, and the errors a submitter gets."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


class QueueFull(RuntimeError):
    """Admission refused: the queue holds max_queue sentences, or the newcomer would wait on others'
    work past max_queue_seconds, or past its own deadline (the API answers 429 with Retry-After)."""

    def __init__(self, depth: int, retry_after: float) -> None:
        super().__init__(f"queue full ({depth} sentences waiting)")
        self.depth = depth
        self.retry_after = retry_after


class DeadlineExceeded(RuntimeError):
    """A queued sentence's deadline passed before its batch started (the API answers 504)."""


class Draining(RuntimeError):
    """The scheduler is draining or stopped: it takes nothing new (the API answers 503)."""


class ModelBroken(RuntimeError):
    """The model's passes fail even on the sentence they answered at start-up (a graph process gone,
    a device in an error state): it takes nothing new, and what it held fails (the API answers 503)."""


class ItemResult(NamedTuple):
    """What one queued sentence gets back: its result and where its time went."""

    value: Any
    queue_seconds: float  # from submission to the start of its batch
    run_seconds: float  # its batch's graph + decode time (shared with the batch's other items)
    batch_id: int  # sentences of one batch share it (a request counts each batch's time once)


class Answer(Protocol):
    """Where a queued sentence's outcome goes, once: an asyncio future (`submit`), or a caller's
    own (`enqueue`: service.api.extraction gathers a request's answers without a future and a
    turn of the event loop a sentence). Done once answered, or once its caller gave up on it
    (the batcher then drops it)."""

    def done(self) -> bool: ...

    def set_result(self, result: ItemResult, /) -> None: ...

    def set_exception(self, error: BaseException, /) -> None: ...


@dataclass(slots=True)  # thousands made and read a second
class WorkItem:
    payload: Any
    cost: int  # sub-words
    enqueued: float
    deadline: float | None
    future: Answer
    tag: int = 0  # fair-queueing round within its tenant (service.batching.fair_queue)
    request: int = 0  # which submit() it came from (a batch takes at most max_request_tokens of one)
    due: float = math.inf  # when its request was promised an answer: past it, it goes first
    tenant: str = ""  # the API key's name ("" without keys)


class Wait(NamedTuple):
    """What a newcomer would wait, in seconds: on others' work ahead of its last sentence in fair
    order (what admission bounds), and until its last sentence is done (what a deadline bounds)."""

    others: float
    total: float


@dataclass(frozen=True)
class PreparedBatch:
    """A batch out of the queue and prepared, for the next free lane."""

    items: list[WorkItem]
    prepared: Any
    tokens: int  # sub-words
    closed: str = ""  # why the batch closed (BatchRecord.closed)
    closed_at: float = 0.0  # on the scheduler's clock: when it closed, and when it was handed to the lanes
    handed_at: float = 0.0

    def wanted(self) -> bool:
        """Whether any of its sentences is still waited for (read in the lane, just before its pass)."""
        return not all(item.future.done() for item in self.items)


@dataclass(frozen=True)
class LaneCall:
    """Other work for a graph thread: a failed batch's sentences one by one, idle housekeeping."""

    call: Callable[[], Any]
    outcome: Future[Any]


@dataclass(frozen=True)
class BatchTimes:
    """A batch's way through the scheduler, on its clock: closed, prepared and handed to the lanes,
    taken by a lane, its own pass (on a device, from the end of the pass queued before it), answered."""

    closed: float
    handed: float
    taken: float
    started: float
    finished: float
    answered: float = 0.0  # set as its answers go out
    device_seconds: float | None = None  # its pass on the device's own clock, where it has one (Scheduler.pass_clock)


@dataclass
class BatchRecord:
    sentences: int
    tokens: int
    padded_tokens: int
    queue_seconds: list[float]
    run_seconds: float
    finished: float
    # why it closed: full; idle (graphs free to take it at once); company (graphs free, after
    # waiting for the rest of a closed loop's clients); clients_back (a closed loop's batch back as
    # the device frees); waited (max_wait passed, then the device's turn); halves (the first half
    # of what an idle device would have taken whole)
    closed: str = ""
    lane: int = 0
    times: BatchTimes | None = None


class BatchObserver(Protocol):
    def batch_done(self, record: BatchRecord) -> None: ...
    def dropped(self, reason: str, count: int) -> None: ...


class NullObserver:
    def batch_done(self, record: BatchRecord) -> None:
        pass

    def dropped(self, reason: str, count: int) -> None:
        pass
