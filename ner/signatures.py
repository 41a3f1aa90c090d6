"""Graph signatures (input/output names and named dynamic axes) shared by training, export, the
programs and the service. Standard library only. An axis named "" is fixed."""

from __future__ import annotations

Signature = tuple[tuple[str, ...], tuple[str, ...]]

ENCODER_INPUTS = ("input_ids", "attention_mask", "subword_index", "subword_mask", "char_ids", "shape_ids", "word_mask")
ENCODER_OUTPUTS = ("word_states", "context")
# Named dynamic axes of every input and output, for export (batch, sequence and word axes vary).
ENCODER_AXES: dict[str, tuple[str, ...]] = {
    "input_ids": ("batch", "subwords"),
    "attention_mask": ("batch", "subwords"),
    "subword_index": ("batch", "words", "pieces"),
    "subword_mask": ("batch", "words", "pieces"),
    "char_ids": ("batch", "words", "chars"),
    "shape_ids": ("batch", "words"),
    "word_mask": ("batch", "words"),
    "word_states": ("batch", "words", ""),
    "context": ("batch", ""),
}

SPAN_INPUTS = ("word_states", "context", "word_mask", "seeds", "seed_mask")
SPAN_OUTPUTS = ("filter_prob", "offsets", "spans", "class_probs")
SPAN_AXES: dict[str, tuple[str, ...]] = {  # "" marks a fixed axis
    "word_states": ("batch", "words", ""),
    "context": ("batch", ""),
    "word_mask": ("batch", "words"),
    "seeds": ("batch", "spans", ""),
    "seed_mask": ("batch", "spans"),
    "filter_prob": ("batch", "spans"),
    "offsets": ("batch", "spans", ""),
    "spans": ("batch", "spans", ""),
    "class_probs": ("batch", "spans", ""),
}


SPAN_GRAPHS: dict[str, Signature] = {
    "encoder": (ENCODER_INPUTS, ENCODER_OUTPUTS),
    "span_proposal": (SPAN_INPUTS, SPAN_OUTPUTS),
}
AXES: dict[str, dict[str, tuple[str, ...]]] = {"encoder": ENCODER_AXES, "span_proposal": SPAN_AXES}

# NAG-NER: encoder + entity-start classifier, then one parallel decoder pass over all queries
# (a query = one entity to write: sentence, start word, start sub-word position, rank n).
NAG_ENCODER_INPUTS = (*ENCODER_INPUTS, "subword_words", "memory_mask")
NAG_ENCODER_OUTPUTS = ("start_probs", "memory", "word_queries")
NAG_DECODER_INPUTS = ("memory", "memory_mask", "word_queries", "query_sentence", "query_word", "query_position", "query_rank")
NAG_DECODER_OUTPUTS = ("token_ids", "token_probs")
NAG_AXES: dict[str, dict[str, tuple[str, ...]]] = {
    "encoder": {
        **{name: ENCODER_AXES[name] for name in ENCODER_INPUTS},
        "subword_words": ("batch", "subwords"),
        "memory_mask": ("batch", "subwords"),
        "start_probs": ("batch", "words", ""),
        "memory": ("batch", "subwords", ""),
        "word_queries": ("batch", "words", ""),
    },
    "decoder": {
        "memory": ("batch", "subwords", ""),
        "memory_mask": ("batch", "subwords"),
        "word_queries": ("batch", "words", ""),
        "query_sentence": ("queries",),
        "query_word": ("queries",),
        "query_position": ("queries",),
        "query_rank": ("queries",),
        "token_ids": ("queries", ""),
        "token_probs": ("queries", ""),
    },
}
NAG_GRAPHS: dict[str, Signature] = {
    "encoder": (NAG_ENCODER_INPUTS, NAG_ENCODER_OUTPUTS),
    "decoder": (NAG_DECODER_INPUTS, NAG_DECODER_OUTPUTS),
}

# DiffusionNER: the shared encoder once, then one denoiser step per DDIM step over K noisy spans
# (K = "proposals" varies per request; the sampling loop runs outside the graphs).
DIFFUSION_INPUTS = ("word_states", "word_mask", "noisy_spans", "timestep")
DIFFUSION_OUTPUTS = ("class_probs", "left_probs", "right_probs")
DIFFUSION_AXES: dict[str, dict[str, tuple[str, ...]]] = {
    "encoder": ENCODER_AXES,
    "denoiser": {
        "word_states": ("batch", "words", ""),
        "word_mask": ("batch", "words"),
        "noisy_spans": ("batch", "proposals", ""),
        "timestep": ("batch",),
        "class_probs": ("batch", "proposals", ""),
        "left_probs": ("batch", "proposals", "words"),
        "right_probs": ("batch", "proposals", "words"),
    },
}
DIFFUSION_GRAPHS: dict[str, Signature] = {
    "encoder": (ENCODER_INPUTS, ENCODER_OUTPUTS),
    "denoiser": (DIFFUSION_INPUTS, DIFFUSION_OUTPUTS),
}
