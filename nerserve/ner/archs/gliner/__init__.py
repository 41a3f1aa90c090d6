"""gliner — GLiNER (Zaratiana et al., NAACL 2024): the request's label names and the sentence's
words through one bidirectional encoder; every span of up to `max_width` words scored against
every label's vector. Open labels, flat or nested entities, one encoder pass per sentence."""

from nerserve.ner.archs.base import ArchitectureSpec, Capabilities, Tuning
from nerserve.ner.archs.gliner.config import GlinerConfig, GlinerOptions
from nerserve.ner.archs.gliner.program import GlinerProgram
from nerserve.ner.archs.gliner.signatures import signatures

THRESHOLDS = tuple(round(0.05 + 0.05 * i, 2) for i in range(14))  # 0.05 to 0.7

SPEC = ArchitectureSpec(
    name="gliner",
    config=GlinerConfig,
    options=GlinerOptions,
    program=GlinerProgram,
    signatures=signatures,
    capabilities=Capabilities(nested=True, open_labels=True),
    tuning=Tuning({"threshold": THRESHOLDS}),
    network="nerserve.ner.archs.gliner.network:GlinerNetwork",
    trainer="nerserve.ner.training.gliner_trainer:train_gliner",
)
