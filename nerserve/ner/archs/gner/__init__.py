"""gner — GNER (Ding et al., 2024): a seq2seq model reads an instruction, the request's label
names and the sentence, and writes every word back with its BIO tag (`w1(O) w2(B-person) …`:
the non-entity words are the negative instances); the output is aligned onto the input words by
hierarchical matching (identical → subsequence → Hunt–Szymanski LCS). Open labels: each request
brings its own. Flat entities."""

from nerserve.ner.archs.base import ArchitectureSpec, Capabilities, Tuning
from nerserve.ner.archs.gner.config import GnerConfig, GnerOptions
from nerserve.ner.archs.gner.program import GnerProgram
from nerserve.ner.archs.gner.signatures import signatures

SPEC = ArchitectureSpec(
    name="gner",
    config=GnerConfig,
    options=GnerOptions,
    program=GnerProgram,
    signatures=signatures,
    capabilities=Capabilities(open_labels=True, autoregressive=True, writes_every_word=True),
    tuning=Tuning({}),
    network="nerserve.ner.archs.gner.network:GnerNetwork",
    trainer="nerserve.ner.training.gner_trainer:train_gner",
)
