"""bartner — BARTNER (Yan et al., 2021): the whole entity sequence of a sentence written left to
right by a pointer decoder (`ptr … ptr type … </s>`), greedy or beam. The autoregressive 1×
reference of the SetGNER, NAG-NER and DiffusionNER speed tables, on the same encoder and the same
pointer decoder as setgen. Flat, nested and discontinuous entities."""

from nerserve.ner.archs.bartner.config import BartnerConfig, BartnerOptions
from nerserve.ner.archs.bartner.program import BartnerProgram
from nerserve.ner.archs.bartner.signatures import signatures
from nerserve.ner.archs.base import ArchitectureSpec, Capabilities, Tuning

SPEC = ArchitectureSpec(
    name="bartner",
    config=BartnerConfig,
    options=BartnerOptions,
    program=BartnerProgram,
    signatures=signatures,
    capabilities=Capabilities(nested=True, discontinuous=True, autoregressive=True),
    int8_graphs=("encoder", "decoder"),
    tuning=Tuning({"threshold": (0.0, 0.2, 0.3, 0.4, 0.5, 0.6)}),
    network="nerserve.ner.archs.bartner.network:BartnerNetwork",
    trainer="nerserve.ner.training.bartner_trainer:train_bartner",
)
