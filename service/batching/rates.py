"""How fast a model's batches run, by batch size: what admission divides queued work by.

A batch of 32 sentences runs faster per sentence than a batch of 2 (span-conll03 on one core: 80
sentences/s alone, 145 in batches of 32), and a server below capacity runs small batches. One
rate for every queue length, learnt from whatever batches ran last, therefore promised a burst of
60 queued sentences the small batches' rate, about 1.5× the wait it then had: at 70 % of capacity
the edge refused bursts that it went on to serve within the bound. Rates are kept per power-of-two
batch size and a queue is estimated at the rate of the batches it would form.
"""

from __future__ import annotations

SMOOTHING = 0.2  # weight of a new back-to-back sample in its size's moving average


class BatchRates:
    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self._by_size: dict[int, float] = {}  # bucket (bit length of the batch size) → sentences/s

    def __bool__(self) -> bool:
        return bool(self._by_size)

    def _bucket(self, sentences: int) -> int:
        return min(max(sentences, 1), self.max_batch_size).bit_length()

    def observe(self, sentences: int, rate: float) -> None:
        """A back-to-back batch of `sentences` ran at `rate` sentences/s."""
        bucket = self._bucket(sentences)
        last = self._by_size.get(bucket)
        self._by_size[bucket] = rate if last is None else (1 - SMOOTHING) * last + SMOOTHING * rate

    def at(self, queued: int) -> float:
        """Sentences/s at which `queued` sentences would run (0 until a batch has been measured):
        the rate of the largest measured batch size not above the batches they would form, else
        of the smallest measured (never promise a rate that only larger batches were seen to reach)."""
        if not self._by_size:
            return 0.0
        bucket = self._bucket(queued)
        within = [size for size in self._by_size if size <= bucket]
        return self._by_size[max(within) if within else min(self._by_size)]
