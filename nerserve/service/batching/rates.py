"""How fast a model's batches run, by batch size in sub-words: what admission divides queued work by.

A large batch runs faster a sub-word than a small one, and a server below capacity runs small
batches: one rate for every queue length, learnt from whatever batches ran last, promised a burst
the small batches' rate and refused bursts it went on to serve within the bound. Rates are kept
per power-of-two batch size and a queue is estimated at the rate of the batches it would form.
Sub-words, not sentences: a window of a long text costs what twenty short sentences cost, and a
rate in sentences learnt from one kind is wrong for the other by that much.
"""

from __future__ import annotations

SMOOTHING = 0.2  # weight of a new back-to-back sample in its size's moving average


class BatchRates:
    def __init__(self, max_batch_tokens: int) -> None:
        self.max_batch_tokens = max_batch_tokens
        self._by_size: dict[int, float] = {}  # bucket (bit length of the batch's sub-words) → sub-words/s
        # `at` by bucket until the next observation: admission asks it for every request, a batch
        # changes it once
        self._answers: dict[int, float] = {}

    def __bool__(self) -> bool:
        return bool(self._by_size)

    def _bucket(self, tokens: int) -> int:
        return min(max(tokens, 1), self.max_batch_tokens).bit_length()

    def observe(self, tokens: int, rate: float) -> None:
        """A back-to-back batch of `tokens` sub-words ran at `rate` sub-words/s."""
        bucket = self._bucket(tokens)
        self._answers.clear()
        last = self._by_size.get(bucket)
        self._by_size[bucket] = rate if last is None else (1 - SMOOTHING) * last + SMOOTHING * rate

    def at(self, queued: int) -> float:
        """Sub-words/s at which `queued` sub-words would run (0 until a batch has been measured):
        the rate of the largest measured batch size not above the batches they would form, else
        of the smallest measured (never promise a rate that only larger batches were seen to reach)."""
        if not self._by_size:
            return 0.0
        bucket = self._bucket(queued)
        rate = self._answers.get(bucket)
        if rate is None:
            within = [size for size in self._by_size if size <= bucket]
            rate = self._answers[bucket] = self._by_size[max(within) if within else min(self._by_size)]
        return rate
