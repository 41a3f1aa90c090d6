"""NAG-NER: entity-start counts + a non-autoregressive decoder that writes every entity at once."""
