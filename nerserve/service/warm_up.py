"""A model's passes before it reports ready, through the path its requests take (prepare, the graphs
where they run, in a graph process too, decode), so that readiness means a request will not pay
first-call costs (sessions' memory, a GPU's libraries and kernels, TorchScript's profiling runs).

On a GPU the second pass is a full batch at the batch limits: the most sentences, each of the most
sub-words the token bound leaves it (a window at most). Limits the device's memory cannot hold then
stop the start-up, naming them, instead of failing batches under load. Its text names no entity, so
that the generative decoders' loops stay short: it is the encoder's rows that fill the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import cycle
from typing import Any

from nerserve.ner.text.subword import SubwordEncoder, Tokenized
from nerserve.service.start_up_exports import ModelLoadError

ONE_SENTENCE = ("Angela", "Merkel", "visited", "the", "Siemens", "plant", "in", "Paris", "on", "Tuesday", ".")
FILLER = ("the", "results", "of", "the", "study", "were", "reported", "in", "the", "annual", "review", ".")
# A graph's second and third calls still cost more than later ones (TorchScript profiles its first
# and optimises at its second; eager torch and ONNX Runtime size their buffers): the lone sentence
# goes this many times.
ONE_SENTENCE_PASSES = 3


@dataclass(frozen=True)
class FullBatch:
    """The batch limits a warm-up fills: sentences, and sub-words in all (a sentence's at most a window)."""

    sentences: int
    tokens: int
    window: int

    @property
    def sentence_subwords(self) -> int:
        return max(1, min(self.window, self.tokens // self.sentences))


@dataclass(frozen=True)
class WarmUp:
    """What the passes took, shown in GET /models: the lone sentence's first and last passes (the
    first-call costs are their difference) and the full batch's. The lone sentence's sub-words
    (specials included, as the batcher counts them) and last pass are admission's first estimate."""

    one_sentence_ms: tuple[float, float]
    full_batch: dict[str, Any] | None
    one_sentence_subwords: int

    def passes(self) -> list[tuple[int, float]]:
        """(sub-words, seconds) of the lone sentence's last pass and of the full batch, if it ran."""
        measured = [(self.one_sentence_subwords, self.one_sentence_ms[1] / 1000)]
        if self.full_batch is not None:
            batch = self.full_batch
            measured.append((batch["sentences"] * batch["sentence_subwords"], batch["ms"] / 1000))
        return measured

    def as_dict(self) -> dict[str, Any]:
        first, last = self.one_sentence_ms
        return {"one_sentence_first_ms": first, "one_sentence_last_ms": last, "full_batch": self.full_batch}


def filler_sentence(subwords: SubwordEncoder, most: int) -> Tokenized:
    """Words of FILLER, in turn, up to MOST sub-words with the specials (one word at least)."""
    budget = most - subwords.special_count
    filler = subwords.tokenize([list(FILLER)])[0]
    words: list[str] = []
    pieces: list[tuple[int, ...]] = []
    used = 0
    for word, piece in cycle(zip(filler.words, filler.pieces, strict=True)):
        if words and used + len(piece) > budget:
            break
        words.append(word)
        pieces.append(piece)
        used += len(piece)
    return Tokenized.of(words, pieces)


def known_good_payload(subwords: SubwordEncoder, options: Any) -> tuple[Tokenized, Any]:
    """The warm-up's lone sentence with OPTIONS: a model that served has answered it."""
    return subwords.tokenize([list(ONE_SENTENCE)])[0], options


def warm_up(
    name: str,
    passes: Callable[[list[tuple[Tokenized, Any]]], Any],
    subwords: SubwordEncoder,
    options: Any,
    full_batch: FullBatch | None,
    rounds: int = 1,
) -> WarmUp:
    """PASSES: prepare → graphs → decode of payloads, as the scheduler runs them, each ROUNDS times
    over (the graph processes of a model, which take its lanes in turn: every one its own passes).
    Raises ModelLoadError naming the pass that failed (and the limits, for the full batch)."""
    payload = known_good_payload(subwords, options)
    try:
        times = [_timed(passes, [payload]) for _ in range(ONE_SENTENCE_PASSES * rounds)]
    except Exception as error:  # whatever the runtime raises, the model cannot serve
        raise ModelLoadError(f"{name}: warming up on one sentence failed: {type(error).__name__}: {error}") from error
    one_sentence_ms = times[0], times[-1]
    one_sentence_subwords = payload[0].subwords + subwords.special_count
    if full_batch is None:
        return WarmUp(one_sentence_ms, None, one_sentence_subwords)
    filler = filler_sentence(subwords, full_batch.sentence_subwords)
    filler_subwords = filler.subwords + subwords.special_count
    payloads = [(filler, options)] * full_batch.sentences
    limits = f"{full_batch.sentences} sentences of {filler_subwords} sub-words"
    try:
        ms = max(_timed(passes, payloads) for _ in range(rounds))
    except Exception as error:
        raise ModelLoadError(
            f"{name}: warming up at the batch limits ({limits}) failed: {type(error).__name__}: {error}; "
            "lower --max-batch-size or --max-batch-tokens"
        ) from error
    return WarmUp(
        one_sentence_ms,
        {"sentences": full_batch.sentences, "sentence_subwords": filler_subwords, "ms": ms},
        one_sentence_subwords,
    )


def _timed(passes: Callable[[list[tuple[Tokenized, Any]]], Any], payloads: list[tuple[Tokenized, Any]]) -> float:
    started = time.perf_counter()
    passes(payloads)
    return round((time.perf_counter() - started) * 1000, 1)
