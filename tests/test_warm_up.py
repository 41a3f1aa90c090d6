"""A model's warm-up passes: one sentence, then (on a GPU by default) a full batch at the batch
limits; a pass that fails is a load error naming it and the limits to lower."""

from __future__ import annotations

from typing import Any

import pytest

from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.text.subword import SubwordEncoder, Tokenized, load_tokenizer
from nerserve.service.config import Settings
from nerserve.service.start_up_exports import ModelLoadError
from nerserve.service.warm_up import ONE_SENTENCE, FullBatch, filler_sentence, warm_up


@pytest.fixture(scope="module")
def subwords() -> SubwordEncoder:
    return SubwordEncoder(load_tokenizer(resolve_backbone().path))


def test_the_full_batch_fills_the_limits_a_sentence_at_most_a_window(subwords: SubwordEncoder) -> None:
    assert FullBatch(256, 65536, 384).sentence_subwords == 256
    assert FullBatch(32, 65536, 384).sentence_subwords == 384  # a window at most
    for most in (3, 17, 64, 256):
        filler = filler_sentence(subwords, most)
        total = filler.subwords + subwords.special_count
        assert total <= most or len(filler.words) == 1
        assert most - total < 4  # no room left for another filler word


def test_passes_run_on_the_sentences_the_limits_allow_and_failures_name_them(subwords: SubwordEncoder) -> None:
    batches: list[list[tuple[Tokenized, Any]]] = []
    warmed = warm_up("m", batches.append, subwords, "options", FullBatch(4, 256, 384))
    assert [len(batch) for batch in batches] == [1, 1, 1, 4]  # the lone sentence three times
    assert {options for batch in batches for _, options in batch} == {"options"}
    assert warmed.full_batch is not None and warmed.full_batch["sentence_subwords"] == 64
    # admission's first estimate: the lone sentence's sub-words (specials included) and the full batch's
    lone = subwords.tokenize([list(ONE_SENTENCE)])[0].subwords + subwords.special_count
    assert [tokens for tokens, _ in warmed.passes()] == [lone, 4 * 64]
    assert all(seconds >= 0 for _, seconds in warmed.passes())
    assert warm_up("m", batches.append, subwords, None, None).full_batch is None  # one sentence only
    batches.clear()  # two graph processes, which take the lanes in turn: each its own passes
    warm_up("m", batches.append, subwords, "options", FullBatch(4, 256, 384), rounds=2)
    assert [len(batch) for batch in batches] == [1, 1, 1, 1, 1, 1, 4, 4]

    def out_of_memory(payloads: list[tuple[Tokenized, Any]]) -> None:
        if len(payloads) > 1:
            raise MemoryError("CUDA out of memory")

    with pytest.raises(
        ModelLoadError,
        match=r"m: warming up at the batch limits \(4 sentences of 64 sub-words\) failed: "
        r"MemoryError: CUDA out of memory; lower --max-batch-size or --max-batch-tokens",
    ):
        warm_up("m", out_of_memory, subwords, None, FullBatch(4, 256, 384))

    def broken(payloads: list[tuple[Tokenized, Any]]) -> None:
        raise ValueError("graph refused its feeds")

    with pytest.raises(ModelLoadError, match="m: warming up on one sentence failed: ValueError: graph refused its feeds"):
        warm_up("m", broken, subwords, None, FullBatch(4, 256, 384))


def test_the_full_batch_runs_on_cuda_and_the_simulated_device_by_default() -> None:
    assert Settings(device="cuda").warms_up_at_batch_limits and Settings(device="simulated").warms_up_at_batch_limits
    assert not Settings().warms_up_at_batch_limits
    assert Settings(warm_up_at_batch_limits=True).warms_up_at_batch_limits
