"""When the batch gathering closes, and how much of the queue it takes, beyond its size limits and
max_wait: the rules by which a device is kept busy under a closed loop of clients.

Clients that send their next request as soon as they are answered travel in cohorts: a device's
next batch is the clients back from its last. These rules read that from the queue, what the lanes
are doing and the times measured by batch size (timing.LaneTimes): a batch closes as its clients are
back (`clients_back`), waits a little for the rest of a loop where a pass costs mostly its launches
(`company_until`), and an idle device takes a large queue in halves where that keeps it busier
(`pipelined_limits`; `rejoin` where the halves prove too dear). The scheduler waits on its events
by them (Scheduler._wait_for_batch).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from nerserve.service.batching.fair_queue import FairQueue
from nerserve.service.batching.packing import BatchLimits
from nerserve.service.batching.timing import LaneTimes
from nerserve.service.batching.work import WorkItem

# pipelined_limits: a batch at this share of the device's batch limits counts as full (a closed
# loop's last few clients may send a moment after the batch closes)
FULL_SHARE = 0.9
# taken: a batch this many times the batch split in halves says the closed loop that was split is
# gone (its own batches hold at most its clients, whose sentences' lengths vary a little), and
# `rejoin` no longer waits for an idle device to rejoin it
SPLIT_FORGOTTEN = 2.0
# rejoin: the share of the batch that was split which, queued again, is the two halves rejoined
# (a few of its clients may have left, or send a little later)
REJOINED_SHARE = 0.9
# company_until: the batches over which the sentences in flight at once are the load's population
# (the largest of each batch's gathering); a load that shrinks is forgotten after as many batches
POPULATION_WINDOW = 16


@dataclass
class ClosingRules:
    """The rules for one scheduler's QUEUE and lanes (TIMES), within LIMITS."""

    queue: FairQueue[WorkItem]
    times: LaneTimes
    limits: BatchLimits
    clock: Callable[[], float]
    split_whole: float | None = None  # the sub-words of the batch last split in halves (pipelined_limits)
    split_half: float = 0.0  # and of its first half
    # the most sentences in flight at once while each of the last batches gathered
    populations: deque[int] = field(default_factory=lambda: deque(maxlen=POPULATION_WINDOW))
    _in_flight_peak: int = 0  # the most sentences in flight while the batch now gathering did

    def in_flight(self, sentences: int) -> None:
        """SENTENCES are in flight now (queued, prepared, running or being answered)."""
        self._in_flight_peak = max(self._in_flight_peak, sentences)

    def taken(self, tokens: int, in_flight: int) -> None:
        """A batch of TOKENS sub-words left the queue, IN_FLIGHT sentences in flight."""
        self.populations.append(self._in_flight_peak)
        self._in_flight_peak = in_flight
        if self.split_whole is not None and tokens > SPLIT_FORGOTTEN * self.split_whole:
            self.split_whole = None  # far more than the closed loop that was split: the load is another

    def lane_limits(self, limits: BatchLimits) -> BatchLimits:
        """With CPU lanes free, what is queued is shared among them: two half batches on one core
        each finish sooner than one whole batch that leaves a lane idle."""
        free = self.times.free_lanes()
        if free <= 1 or self.times.one_device:  # a device's lanes queue their passes on it: pipelined_limits
            return limits
        share = math.ceil(len(self.queue) / free)
        return replace(limits, max_batch_size=max(1, min(limits.max_batch_size, share)))

    def pipelined_limits(self, limits: BatchLimits) -> BatchLimits:
        """On a device left idle with many sentences queued, half of them first where that keeps it
        busier. Clients that send their next request as soon as they are answered otherwise travel
        as one batch: the device runs it while the host waits, then waits while the host answers,
        takes back and prepares all of it. Two halves alternate instead, one on the device while
        the host turns the other around, where two half passes cost the device at most
        timing.PIPELINE_COST_RATIO times the whole one, from the pass times measured, and only for a
        size that has run whole (else it runs whole, and is measured); and where the second half can
        be prepared while the first runs, or the batch is full. A full batch on an idle device is a
        closed loop's clients all back at once: halves pay there even with a host slower than a
        half pass, since the device then waits only for what the host takes beyond the other
        half's pass, not for the whole of its turn. A partial one says that requests arrive slower
        than the device serves them (a slow front): halves would only add passes and their host
        work. A half's size that has never run is tried once in halves, and so measured: a pass's
        time between two sizes far apart is not their straight line (a device's cost climbs little
        until its cores are full), and a load whose batches are all of one size never runs one of
        half that size. Where the halves prove too dear, `rejoin` makes them one batch again."""
        times, queue = self.times, self.queue
        if not limits.close_as_device_frees or not times.device_idle() or not times.run or not times.prepare:
            return limits
        count = min(len(queue), limits.max_batch_size)
        if count < 2:
            return limits
        whole = min(queue.tokens, limits.max_batch_tokens)
        if not times.run.has_run(whole):
            return limits
        full = count >= FULL_SHARE * limits.max_batch_size or whole >= FULL_SHARE * limits.max_batch_tokens
        half = whole * math.ceil(count / 2) / count  # the first half as it will run, and be measured
        if times.halves_dearer(whole, half) or not (full or times.host_keeps_up(half)):
            return limits
        self.split_whole, self.split_half = whole, half
        return replace(limits, max_batch_size=math.ceil(count / 2))

    def company_until(self, in_flight: int) -> float | None:
        """Until when a batch for an idle device waits for the rest of a closed loop, or None where
        it closes at once, IN_FLIGHT sentences in flight now. On a device whose pass costs mostly a
        fixed part (the launches of a small batch's kernels, which Python makes one by one), a
        loop's clients that come back a few at a time would otherwise each find the device idle and
        go as a batch of their own, each paying that part: the loop travels as a few small batches
        where one would cost the device little more than any of them. So, where fewer sentences are
        in flight now than the most in flight at once over the last batches (the load's
        population), and a pass with the missing clients' sentences too would cost less than a
        second pass of what is queued, the batch waits for them: for at most a pass of its own
        (what the clients still out would wait behind it) and `max_wait_ms`, from its first
        sentence's arrival. A lone client, or an open load at its steady level, is always all in
        flight: no wait."""
        run, queue = self.times.run, self.queue
        if not self.times.one_device or not run or not queue:
            return None
        population = max(self.populations, default=0)
        if in_flight >= population:  # all of it: a client left behind goes on as a batch of its own
            return None
        queued, count = queue.tokens, len(queue)
        missing = population - in_flight
        if run.seconds(queued * (count + missing) / count) >= 2 * run.seconds(queued):
            return None
        return queue.oldest_arrival() + min(self.limits.max_wait_ms / 1000, run.seconds(queued))

    def clients_back(self) -> bool:
        """Whether, with a pass on the device that ends before a batch closed now could start after
        it (`LaneTimes.gathering_time`), the batch gathering holds as many sentences as that pass's
        batch (FULL_SHARE of them; sentences, as clients come back, not sub-words, which vary with
        what each sends): a closed loop's next batch, its clients back. The other half, where a
        batch was split in halves; or another HTTP worker's requests, whose answers went out in one
        message and whose clients sent again together (two workers' clients take turns on the
        device so, without any batch split). Waiting on for max_wait would gather nothing more and
        only delay its prepare past the pass, leaving the device idle for the difference; where the
        pass leaves time, the batch gathers on. Not while a prepared batch waits for the device:
        this one would wait behind it, and may as well grow, so under a load the device cannot keep
        up with, batches still grow to its limits."""
        times, queue = self.times, self.queue
        on_device = times.on_device
        back = bool(times.ends) and not times.handed and on_device > 0 and len(queue) >= FULL_SHARE * on_device
        return back and times.gathering_time(queue.tokens, self.clock()) <= 0

    def rejoin(self) -> float | None:
        """A closed loop split in halves (`pipelined_limits`) stays split: each half gathers while the
        other runs. Where the halves proved too dear, the sub-words that make them one batch again:
        the half queued then waits for the device to finish the other and for that half's clients
        to send again (until the queue holds those sub-words, or max_wait after the device frees).
        None: nothing to rejoin."""
        whole = self.split_whole
        if whole is None or not self.times.halves_dearer(whole, self.split_half):
            return None
        self.split_whole = None
        return REJOINED_SHARE * whole
