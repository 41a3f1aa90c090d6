"""DiffusionNER's graphs: the shared encoder once, then one denoiser step per DDIM step over K
noisy spans (K = "proposals" varies per request; the sampling loop runs outside the graphs)."""

from __future__ import annotations

from nerserve.ner.archs.diffusion.config import DiffusionConfig
from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.graph import GraphSignature

DENOISER = GraphSignature(
    ("word_states", "word_mask", "noisy_spans", "timestep"),
    ("class_probs", "left_probs", "right_probs"),
    {
        "word_states": ("batch", "words", ""),
        "word_mask": ("batch", "words"),
        "noisy_spans": ("batch", "proposals", ""),
        "timestep": ("batch",),
        "class_probs": ("batch", "proposals", ""),
        "left_probs": ("batch", "proposals", "words"),
        "right_probs": ("batch", "proposals", "words"),
    },
)


def signatures(config: DiffusionConfig) -> dict[str, GraphSignature]:
    return {"encoder": ENCODER, "denoiser": DENOISER}
