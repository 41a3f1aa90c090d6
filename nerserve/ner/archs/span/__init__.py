"""span — Locate and Label (Shen et al., ACL 2021): seed spans → filter + boundary regressor →
classifier on the adjusted spans → Soft-NMS. Flat and nested entities."""

from nerserve.ner.archs.base import ArchitectureSpec, Capabilities, Tuning
from nerserve.ner.archs.span.config import DecodeOptions, SpanConfig
from nerserve.ner.archs.span.program import SpanProgram
from nerserve.ner.archs.span.signatures import signatures

THRESHOLDS = tuple(round(0.3 + 0.05 * i, 2) for i in range(11))  # δ from 0.3 to 0.8

SPEC = ArchitectureSpec(
    name="span",
    config=SpanConfig,
    options=DecodeOptions,
    program=SpanProgram,
    signatures=signatures,
    capabilities=Capabilities(nested=True),
    tuning=Tuning({"threshold": THRESHOLDS, "nms_decay": (0.9, 0.6, 0.3)}),
    network="nerserve.ner.archs.span.network:SpanNetwork",
    trainer="nerserve.ner.training.span_trainer:train_span",
    # the proposal graph's per-word maps are a sixth of the INT8 model's graph time on the CPU:
    # quantised, that graph runs about 15 % faster with the same test F1 (docs/decisions/cpu-inference.md)
    int8_graphs=("encoder", "span_proposal"),
)
