"""How fast a model's batches run, by batch size in sub-words: what admission divides queued work by.

A large batch runs faster a sub-word than a small one, and a server below capacity runs small
batches: one rate for every queue length, learnt from whatever batches ran last, promised a burst
the small batches' rate and refused bursts it went on to serve within the bound. Rates are kept
per power-of-two batch size and a queue is estimated at the rate of the batches it would form.
Sub-words, not sentences: a window of a long text costs what twenty short sentences cost, and a
rate in sentences learnt from one kind is wrong for the other by that much.
"""

from __future__ import annotations

import bisect
import math

SMOOTHING = 0.2  # weight of a new back-to-back sample in its size's moving average


class BatchRates:
    """Sub-words per second by batch size. Between two measured sizes a batch's time runs along the
    line between theirs: a GPU's pass costs mostly a fixed part, so the next smaller size's rate
    would understate a batch of ten times its sub-words tenfold (a lone sentence's rate, before
    larger batches had run, refused most of a cold burst of 256 on the simulated H100). Beyond the
    largest measured size, the largest's rate: never one that only larger batches were seen to
    reach. Below the smallest, the smallest's."""

    def __init__(self, max_batch_tokens: int) -> None:
        self.max_batch_tokens = max_batch_tokens
        self._by_size: dict[int, tuple[float, float]] = {}  # bucket (bit length) → (sub-words, sub-words/s), smoothed
        self._points: list[tuple[float, float]] = []  # (sub-words, seconds) by sub-words, rebuilt as one changes
        # `at` by sub-words until the next observation: admission asks it twice a request, and under
        # load for the same size (a queue's batches are capped at the batch limits)
        self._answers: dict[float, float] = {}
        self.slowest = 0.0  # the least of `at` over every size (0 until a batch has been measured)

    def __bool__(self) -> bool:
        return bool(self._by_size)

    def observe(self, tokens: int, rate: float) -> None:
        """A back-to-back batch of `tokens` sub-words ran at `rate` sub-words/s."""
        _smooth_into(self._by_size, min(max(tokens, 1), self.max_batch_tokens), rate)
        self._points = sorted((size, size / speed) for size, speed in self._by_size.values())
        self._answers.clear()
        # between two sizes a batch's time runs along a line, along which sub-words ÷ seconds only
        # rises or only falls: the slowest rate is a measured size's
        self.slowest = min(speed for _, speed in self._by_size.values())

    def at(self, tokens: float) -> float:
        """Sub-words/s at which batches of `tokens` sub-words would run (0 until a batch has been measured)."""
        rate = self._answers.get(tokens)
        if rate is None:
            rate = self._answers[tokens] = self._rate(min(max(tokens, 1.0), self.max_batch_tokens))
        return rate

    def _rate(self, tokens: float) -> float:
        points = self._points
        if not points:
            return 0.0
        low_tokens, low_seconds = points[0]
        if tokens <= low_tokens:
            return low_tokens / low_seconds
        high_tokens, high_seconds = points[-1]
        if tokens >= high_tokens:
            return high_tokens / high_seconds
        return tokens / _between(points, tokens)


class PassTimes:
    """What one stage (a device pass, a prepare) takes for a batch of so many sub-words, learnt from
    the batches it ran: a moving average of the sub-words and the seconds per power-of-two size,
    and between measured sizes a straight line. A GPU pass costs a fixed part (launches, the
    weights' reads) and a part by sub-words, so a size not run yet, such as half of the batches
    that ran, is estimated from its neighbours rather than at the rate of the next smaller size.
    Below the smallest measured size: that size's time (a pass costs at least that); beyond the
    largest: along the line through the two largest (the largest's time a sub-word while it is the
    only one)."""

    def __init__(self) -> None:
        self._by_size: dict[int, tuple[float, float]] = {}  # bucket → (sub-words, seconds), smoothed
        self._points: list[tuple[float, float]] = []  # the same, by sub-words, rebuilt as one changes

    def __bool__(self) -> bool:
        return bool(self._by_size)

    def has_run(self, tokens: float) -> bool:
        """Whether batches of this power-of-two size, or larger, have run."""
        return bool(self._by_size) and int(max(tokens, 1)).bit_length() <= max(self._by_size)

    def measured(self, tokens: float) -> bool:
        """Whether batches of this power-of-two size have run (its time is measured, not interpolated)."""
        return int(max(tokens, 1)).bit_length() in self._by_size

    def observe(self, tokens: int, seconds: float) -> None:
        _smooth_into(self._by_size, max(tokens, 1), seconds)
        self._points = sorted(self._by_size.values())

    def seconds(self, tokens: float) -> float:
        """The time for a batch of TOKENS sub-words (0 until one has been measured)."""
        points = self._points
        if not points:
            return 0.0
        if tokens <= points[0][0]:
            return points[0][1]
        if tokens >= points[-1][0]:
            if len(points) == 1:
                return points[-1][1] * tokens / points[-1][0]
            (low_tokens, low_seconds), (high_tokens, high_seconds) = points[-2], points[-1]
            slope = max(0.0, (high_seconds - low_seconds) / (high_tokens - low_tokens))
            return high_seconds + slope * (tokens - high_tokens)
        return _between(points, tokens)


def _smooth_into(by_size: dict[int, tuple[float, float]], tokens: int, value: float) -> None:
    """A batch of TOKENS sub-words measured VALUE: into the moving averages of its power-of-two size."""
    bucket = tokens.bit_length()
    last = by_size.get(bucket)
    if last is None:
        by_size[bucket] = (float(tokens), value)
    else:
        by_size[bucket] = ((1 - SMOOTHING) * last[0] + SMOOTHING * tokens, (1 - SMOOTHING) * last[1] + SMOOTHING * value)


def _between(points: list[tuple[float, float]], tokens: float) -> float:
    """Seconds for TOKENS strictly between the first and the last of POINTS ((sub-words, seconds),
    sorted): along the line between the measured sizes around it."""
    index = bisect.bisect_left(points, (tokens, -math.inf))
    (low_tokens, low_seconds), (high_tokens, high_seconds) = points[index - 1], points[index]
    return low_seconds + (high_seconds - low_seconds) * (tokens - low_tokens) / (high_tokens - low_tokens)
