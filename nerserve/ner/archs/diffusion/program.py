"""Runs DiffusionNER's graphs for a batch of sentences (numpy in, numpy out): the encoder once,
then `steps` denoiser passes over K noisy spans per sentence with DDIM updates in float64.

Noise is drawn per sentence from its options' seed (a fresh generator per sentence), so a
sentence's entities never depend on what it is batched with. Sentences of one batch may ask for
different K / steps: each group of equal (K, steps) runs its own denoiser passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.archs.diffusion.config import DiffusionConfig, DiffusionDecodeOptions
from nerserve.ner.archs.diffusion.decode import decode_batch
from nerserve.ner.archs.diffusion.schedule import Sampler, spans_to_noise, step_pairs
from nerserve.ner.archs.diffusion.signatures import DENOISER
from nerserve.ner.archs.feeds import encoder_feeds
from nerserve.ner.archs.grouping import groups_for, run_grouped
from nerserve.ner.graph import Graph, GraphSignature
from nerserve.ner.text.subword import SubwordEncoder, Words
from nerserve.ner.types import EntitySet

EXPORT_PROPOSALS = 7  # example K for export: distinct from every other example axis


@dataclass
class DiffusionBatch:
    encoder_inputs: dict[str, np.ndarray]
    lengths: list[int]
    padded_tokens: int


def sentence_noise(seed: int, proposals: int, steps: int) -> np.ndarray:
    """[steps, K, 2]: x_T, then the fresh noise of each later DDIM step; the same for every
    sentence with the same options, whatever its batch."""
    return np.random.default_rng(seed).standard_normal((steps, proposals, 2))


class DiffusionProgram(ProgramBase[DiffusionConfig, DiffusionBatch, DiffusionDecodeOptions]):
    def __init__(
        self,
        graphs: Mapping[str, Graph],
        config: DiffusionConfig,
        subwords: SubwordEncoder,
        signatures: Mapping[str, GraphSignature],
    ) -> None:
        super().__init__(graphs, config, subwords, signatures)
        self.sampler = Sampler(config)

    def prepare(self, sentences: Sequence[Words]) -> DiffusionBatch:
        inputs, encoded = encoder_feeds(self.subwords, sentences)
        return DiffusionBatch(inputs, list(encoded.word_counts), encoded.padded_tokens)

    def denoise(self, word_states: np.ndarray, word_mask: np.ndarray, noise: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        """DDIM from x_T = noise[:, 0] over `steps` denoiser passes; the last pass's outputs."""
        lengths = word_mask.sum(axis=1)
        # on the CPU grouped by sentence length once for every step: the span attention over words
        # costs what the padding does. On a GPU one call a step, on states that stay there.
        word_counts = lengths.astype(np.int64).tolist()
        denoiser = self.graphs["denoiser"]
        groups = groups_for(denoiser, word_counts)
        sizes = {"words": word_counts}
        x = noise[:, 0]
        outputs: dict[str, np.ndarray] = {}
        for index, (t, t_next) in enumerate(step_pairs(self.config.timesteps, steps)):
            feeds = {
                "word_states": word_states,
                "word_mask": word_mask,
                "noisy_spans": x.astype(np.float32),
                "timestep": np.full(len(x), t, dtype=np.int64),
            }
            outputs = run_grouped(denoiser, feeds, DENOISER, sizes, groups)
            if t_next < 0:
                break
            left = outputs["left_probs"].argmax(axis=-1)  # padding words have probability 0
            right = outputs["right_probs"].argmax(axis=-1)
            x0 = spans_to_noise(left, right, lengths[:, None], self.config.scale)
            x = self.sampler.step(x, x0, t, t_next, noise[:, index + 1])
        return outputs

    def run(
        self, batch: DiffusionBatch, options: DiffusionDecodeOptions | Sequence[DiffusionDecodeOptions] | None = None
    ) -> dict[str, np.ndarray]:
        """Encoder outputs, and per proposal (flattened over sentences, `proposal_sentence` says
        whose): class_probs [P, C+1], left_probs and right_probs [P, N] of the last step."""
        chosen = self.per_sentence(options, len(batch.lengths))
        groups: dict[tuple[int, int], list[int]] = {}
        for b, o in enumerate(chosen):
            groups.setdefault((o.proposals, o.steps), []).append(b)
        # on a GPU the word states stay there when every sentence denoises alike; sentences with
        # other options take their rows on the host (a no-op on the CPU). The context vector, which
        # the denoiser does not read, never comes to the host.
        keep = ("word_states", "context") if len(groups) == 1 else ("context",)
        encoded = self.graphs["encoder"].run(batch.encoder_inputs, keep_on_device=keep)
        word_states, word_mask = encoded["word_states"], batch.encoder_inputs["word_mask"]
        parts: list[tuple[list[int], dict[str, np.ndarray]]] = []
        for (proposals, steps), members in sorted(groups.items()):
            rows = np.array(members)
            noise = np.stack([sentence_noise(chosen[b].seed, proposals, steps) for b in members])
            states = word_states if len(members) == len(chosen) else word_states[rows]
            parts.append((members, self.denoise(states, word_mask[rows], noise, steps)))
        sentence = np.concatenate([np.repeat(m, out["class_probs"].shape[1]) for m, out in parts]).astype(np.int64)
        flat = {
            name: np.concatenate([out[name].reshape(-1, *out[name].shape[2:]) for _, out in parts])
            for name in ("class_probs", "left_probs", "right_probs")
        }
        return {**encoded, **flat, "proposal_sentence": sentence}

    def export_values(self, batch: DiffusionBatch) -> dict[str, np.ndarray]:
        """Every graph input and output for export examples (K = EXPORT_PROPOSALS, mid timestep)."""
        encoded = self.graphs["encoder"].run(batch.encoder_inputs)
        count = len(batch.lengths)
        noise = np.random.default_rng(0).standard_normal((count, EXPORT_PROPOSALS, 2)).astype(np.float32)
        feeds = {
            "word_states": encoded["word_states"],
            "word_mask": batch.encoder_inputs["word_mask"],
            "noisy_spans": noise,
            "timestep": np.full(count, self.config.timesteps // 2, dtype=np.int64),
        }
        return {**batch.encoder_inputs, **encoded, **feeds, **self.graphs["denoiser"].run(feeds)}

    def decode(
        self,
        batch: DiffusionBatch,
        outputs: Mapping[str, np.ndarray],
        options: DiffusionDecodeOptions | Sequence[DiffusionDecodeOptions] | None = None,
    ) -> list[EntitySet]:
        chosen = self.per_sentence(options, len(batch.lengths))
        return decode_batch(
            outputs["class_probs"],
            outputs["left_probs"],
            outputs["right_probs"],
            outputs["proposal_sentence"],
            batch.lengths,
            self.config.labels,
            chosen,
        )
