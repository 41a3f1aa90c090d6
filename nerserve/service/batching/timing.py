"""What the graph lanes are doing, as the scheduler's event loop sees them, and how long a batch's
stages take by its size: when each running pass is expected to end, whether a prepared batch waits
in the hand-off slot, and the times measured for passes, prepares and decodes (rates.PassTimes).
The scheduler closes its batches by them (close_as_device_frees, the halves of a closed loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nerserve.service.batching.rates import PassTimes

# What a prepared batch needs beyond its prepare to start as the running one ends (the hand-off,
# the run loop's turn, the graph thread's wake-up)
HAND_OFF_SECONDS = 0.003
# halves_dearer: halves cost a device at most this times the whole batch. A pass costs a fixed
# part (launches, reading the weights) and a part by sub-words: at 1.5 the latter is at least the
# former, and halves pay that fixed part once more to overlap the host's work with the device's.
PIPELINE_COST_RATIO = 1.5
# A batch's prepare or decode expected to take at most this long runs on the event loop itself. Each
# hand-off to its thread and back (a wake-up of the thread, then of the loop through its pipe, each
# waiting for the interpreter lock) costs a lone sentence more than its own host work; past this
# the work would hold the loop's next requests longer than the hand-off saves.
INLINE_HOST_SECONDS = 0.001


@dataclass
class LaneTimes:
    """The lanes' state and the stages' times. `one_device`: lanes that take turns on one device,
    whose passes run one after another (Scheduler.lanes_drive_a_device)."""

    lanes: int = 1
    one_device: bool = False
    # the graphs' own run time by batch sub-words, as the lanes' clocks see it
    run: PassTimes = field(default_factory=PassTimes)
    # the device's own time for those passes where it has a clock (pass_clock), else the lanes'
    device: PassTimes = field(default_factory=PassTimes)
    prepare: PassTimes = field(default_factory=PassTimes)  # as the loop waits for it, a thread's hand-off included
    # for `inline` only: the work's own time, where it runs
    prepare_work: PassTimes = field(default_factory=PassTimes)
    decode: PassTimes = field(default_factory=PassTimes)
    # prepared batches handed to the lanes and not yet taken: one at most (the hand-off slot)
    handed: int = 0
    on_device: int = 0  # the sentences of the batch a lane took last (on the device while a lane runs)
    device_free_at: float = 0.0  # when a device's last pass ended (one_device)
    # when each running lane's pass is expected to end, by lane
    ends: dict[int, float] = field(default_factory=dict)

    def graphs_free(self) -> bool:
        """Nothing prepared for the graphs, and graphs that can take a batch now: a device with no
        pass on it (its lanes take turns on it), or a CPU lane free (each lane has cores of its own,
        so a request that finds one free runs at once beside the other lane's batch)."""
        if self.one_device:
            return self.device_idle()
        return len(self.ends) < self.lanes and not self.handed

    def device_idle(self) -> bool:
        """No batch on the graphs and none prepared for them."""
        return not self.ends and not self.handed

    def free_lanes(self) -> int:
        """Lanes with no pass running and none handed to them."""
        return self.lanes - len(self.ends) - self.handed

    def gathering_time(self, queued: float, now: float) -> float:
        """How long the next batch, of QUEUED sub-words, may still gather and be prepared by the time
        the device, or the first CPU lane, frees, at the run and prepare times measured for batches
        of those sizes; 0 when nothing runs or neither is measured yet."""
        if not self.ends or not self.run or not self.prepare:
            return 0.0
        # a device takes the next batch once its last queued pass ends; CPU lanes, as the first frees
        frees = max(self.ends.values()) if self.one_device else min(self.ends.values())
        return frees - now - self.time_to_start(queued)

    def time_to_start(self, tokens: float) -> float:
        """From a batch of TOKENS closing to its pass starting: twice its measured prepare (a prepare
        shares the cores) and the hand-off."""
        return 2 * self.prepare.seconds(tokens) + HAND_OFF_SECONDS

    def time_to_answer(self, taken: float, tokens: float, parallel: int) -> float:
        """From now until a batch of TOKENS sub-words closed now has run, at the times measured: the
        TAKEN sub-words out of the queue before it (running, prepared) at the graphs' pace, PARALLEL
        batches at once, then its own start and pass."""
        if not self.run:
            return 0.0
        ahead = self.run.seconds(taken) / parallel if taken else 0.0
        return ahead + self.time_to_start(tokens) + self.run.seconds(tokens)

    def host_keeps_up(self, half: float) -> bool:
        """Whether a batch of HALF sub-words can be prepared and handed over within a pass of its size."""
        return self.time_to_start(half) <= self.run.seconds(half)

    def halves_dearer(self, whole: float, half: float) -> bool:
        """Whether two passes of HALF sub-words, that size measured, cost the device more than
        PIPELINE_COST_RATIO times one pass of WHOLE, by the device's own clock where it has one
        (`device`): a half's lane, beside the host turning the other half around, waits longer for
        the interpreter lock than a whole pass's beside an idle host, and by the lanes' clocks
        halves that keep the device busier looked dearer than they are. HALF is the first half as
        split (the larger of an odd count's two): the size the split's first pass measures, so that
        a split tried to measure it never goes on untold for want of a size it does not run."""
        times = self.device
        return times.measured(half) and 2 * times.seconds(half) > PIPELINE_COST_RATIO * times.seconds(whole)

    @staticmethod
    def inline(times: PassTimes, tokens: int) -> bool:
        """Whether a batch's prepare or decode is quick enough to run on the loop (INLINE_HOST_SECONDS),
        by TIMES measured for its size; never before its size, or a larger one, has been timed."""
        return times.has_run(tokens) and times.seconds(tokens) <= INLINE_HOST_SECONDS

    def took(self, lane: int, tokens: int, sentences: int, started: float) -> None:
        """LANE took the handed batch of TOKENS sub-words and SENTENCES at STARTED: the slot is free,
        and the lane is expected to end at the run time measured for that size."""
        self.handed -= 1
        self.on_device = sentences
        if self.one_device:  # queued on the device behind the passes launched before it
            started = max([started, *self.ends.values()])
        self.ends[lane] = started + self.run.seconds(tokens)

    def freed(self, lane: int) -> None:
        """LANE's pass ended."""
        self.ends.pop(lane, None)

    def ran(self, tokens: int, started: float, finished: float, device_seconds: float | None) -> float:
        """A pass of TOKENS sub-words, taken at STARTED, ended at FINISHED (DEVICE_SECONDS on the
        device's own clock, where it has one): measured. Returns when its own pass started: on a
        device, once the pass queued before it ended; a pass on a stream of its own may end before
        one launched earlier, and its own time is then none rather than less."""
        if self.one_device:
            started = min(max(started, self.device_free_at), finished)
            self.device_free_at = max(self.device_free_at, finished)
        self.run.observe(tokens, finished - started)
        own = finished - started if device_seconds is None else min(finished - started, device_seconds)
        self.device.observe(tokens, own)
        return started
