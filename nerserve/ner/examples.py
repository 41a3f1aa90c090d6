"""Sentences that every graph is traced on and then checked against at other sizes: export's
(`export.build`) and the eager runtime's traced heads (`ner.traced_heads`)."""

from __future__ import annotations

# Distinct sizes on every axis (batch, words, sub-words, pieces per word, characters; packed into
# two rows by example_values) so that the exporter cannot mistake one axis for another or
# specialise a size-1 axis.
EXAMPLE_SENTENCES = [
    ["Unbelievably", ",", "the", "EU", "rejects", "German", "call", "to", "boycott", "lamb", "."],
    ["Peter", "Blackburn", "arrived", "in", "Washington"],
    ["IL-2", "gene", "expression", "requires", "NF-kappa", "B", "activation", "."],
]
# Other sizes on every axis than the example's (four sentences, 14 words at most, one packed row), on which a
# traced graph must still give the module's outputs (export.writers.write_onnx, ner.traced_heads).
CHECK_SENTENCES = [
    [
        "Germany",
        "'s",
        "representative",
        "to",
        "the",
        "European",
        "Union",
        "'s",
        "veterinary",
        "committee",
        "said",
        "on",
        "Wednesday",
        ".",
    ],
    ["Shares", "rose"],
    ["Activation", "of", "the", "CD28", "surface", "receptor", "provides", "a", "costimulatory", "signal", "."],
    ["He", "took", "ibuprofen", "."],
]
