"""Admission's estimate: how fast the graphs get through the queue, and so what a newcomer would wait.

Counted in sub-words (a window of 384 sub-words costs what 20 short sentences cost) at the sub-words
per second measured end to end for back-to-back batches, by batch size (rates.BatchRates). A request
whose body is not read yet is weighed as one sentence of the typical size: the median of the last
requests' mean sentence size.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from nerserve.service.batching.packing import BatchLimits
from nerserve.service.batching.rates import BatchRates
from nerserve.service.batching.work import Wait, WorkItem

REQUEST_SIZE_WINDOW = 101
# Every TYPICAL_SAMPLE-th request's sentence size joins that window (the first always): a sample
# sizes a typical sentence as well, and the window's upkeep a request cost the engine about a
# microsecond of the few it spends on one.
TYPICAL_SAMPLE = 4


class SlidingMedian:
    """The median of the last `size` values, kept in order as they come and go: it changes with
    every request the engine accepts, and statistics.median would sort the whole window each time."""

    def __init__(self, size: int) -> None:
        self._window: deque[int] = deque(maxlen=size)
        self._ordered: list[int] = []

    def add(self, value: int) -> None:
        if len(self._window) == self._window.maxlen:
            del self._ordered[bisect.bisect_left(self._ordered, self._window[0])]
        self._window.append(value)
        bisect.insort(self._ordered, value)

    @property
    def median(self) -> float:
        """As statistics.median: the middle value, or the mean of the two middle ones; 0 when empty."""
        ordered, count = self._ordered, len(self._ordered)
        return (ordered[(count - 1) // 2] + ordered[count // 2]) / 2 if count else 0.0


@dataclass
class AdmissionEstimate:
    """The rates measured for `lanes` graph lanes (`one_device`: lanes that take turns on one
    device, whose cycle is the device's) and the typical sentence's size."""

    limits: BatchLimits
    lanes: int = 1
    one_device: bool = False

    def __post_init__(self) -> None:
        # sub-words per second end to end by batch sub-words (see cycle_rate)
        self.rates = BatchRates(self.limits.max_batch_tokens)
        self._last_finished = [0.0] * self.lanes  # by lane, or the device's in slot 0
        # sub-words a sentence of the last accepted requests (each request's mean): their median
        # sizes a sentence at the edge, before a body is read (a mean of all sentences would be
        # moved by one request of a thousand windows)
        self._sentence_sizes = SlidingMedian(REQUEST_SIZE_WINDOW)
        self.typical_sentence = 0  # their median, kept as requests come: the edge reads it for every arrival
        self._requests = 0

    @property
    def measured(self) -> bool:
        """Whether any rate is known yet (before, nothing is refused)."""
        return bool(self.rates)

    @property
    def parallel(self) -> int:
        """Batches that run at once: a CPU's lanes; one on a device, whose lanes take turns."""
        return 1 if self.one_device else self.lanes

    def accepted(self, tokens: int, sentences: int) -> None:
        """A request of SENTENCES and TOKENS sub-words in all was queued."""
        self._requests += 1
        if (self._requests - 1) % TYPICAL_SAMPLE == 0:
            self._sentence_sizes.add(round(tokens / sentences))
            self.typical_sentence = round(self._sentence_sizes.median)

    def formed(self, queued: float) -> float:
        """The sub-words of the batches QUEUED sub-words would form: a batch holds max_batch_size
        sentences of the typical size at most (and max_batch_tokens sub-words: BatchRates)."""
        typical = self.typical_sentence
        return min(queued, self.limits.max_batch_size * typical) if typical else queued

    def wait(self, others: float, own: float) -> Wait:
        """What a newcomer of OWN sub-words waits behind OTHERS sub-words of work ahead of it; no wait
        before anything is measured."""
        rate = self.rates.at(self.formed(others + own))
        if not rate:
            return Wait(0.0, 0.0)
        return Wait(others / rate, (others + own) / rate)

    def surely_within(self, work: float, seconds: float) -> bool:
        """Whether WORK sub-words, all there is with a newcomer's own, are done within SECONDS at
        the slowest rate measured."""
        slowest = self.rates.slowest
        return slowest > 0 and work <= seconds * slowest

    def retry_after(self, queued: float) -> float:
        """Seconds until QUEUED sub-words are worked through, a second at least (a full queue's Retry-After)."""
        rate = self.rates.at(self.formed(queued)) or 1.0
        return max(1.0, queued / rate)

    def first_estimate(self, passes: Sequence[tuple[int, float]]) -> None:
        """The estimate before any batch has run: PASSES of (sub-words, seconds) run on an idle
        service (the warm-up's lone sentence, and on a GPU its full batch), times the lanes that run
        at once. Without it the first estimate is the first batch's run time, and a burst's first
        batch runs alone on an idle device while the loop parses the rest of the burst: on one core
        a lone sentence took four times its warm-up pass, and the burst's second request was
        refused on that estimate; on a GPU a lone sentence's rate says little of a full batch's."""
        if self.rates:
            return
        for tokens, seconds in passes:
            if tokens > 0 and seconds > 0:
                self.rates.observe(tokens, self.parallel * tokens / seconds)

    def batch_ran(self, lane: int, batch: list[WorkItem], tokens: int, finished: float, run_seconds: float) -> None:
        """A batch of TOKENS sub-words ended on LANE at FINISHED, after a pass of RUN_SECONDS."""
        rate = self.cycle_rate(lane, batch, tokens, finished, run_seconds)
        if rate is not None:
            self.rates.observe(tokens, rate)

    def cycle_rate(self, lane: int, batch: list[WorkItem], tokens: int, finished: float, run_seconds: float) -> float | None:
        """BATCH's TOKENS sub-words a second over its whole cycle in its lane, from the previous
        batch's end there to its own, when it was waiting as that one ended (back to back: the
        capacity), times the lanes (back to back in one, the others are busy too). The graphs' run time alone
        over-states the rate: preparing the next batch, the event loop and the decoding share the
        cores with it, so waits promised from run times alone come out too short. A batch after an
        idle spell says how busy the service was, not how fast it is (such samples refuse bursts it
        could serve): none is taken from it, except, where nothing is measured yet (no
        `first_estimate`), an estimate from its run time (docs/decisions/admission.md). A device's
        lanes take turns on one device: its cycle is from the last pass's end on any of them."""
        parallel = self.parallel
        slot = 0 if self.one_device else lane
        previous, self._last_finished[slot] = self._last_finished[slot], finished
        if min(item.enqueued for item in batch) <= previous:
            return parallel * tokens / max(finished - previous, 1e-6)
        return None if self.rates else parallel * tokens / max(run_seconds, 1e-6)
