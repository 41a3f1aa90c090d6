"""The pointer decoder shared by setgen (SetGNER) and bartner (BARTNER): an autoregressive
transformer decoder over the word encoder's states whose output vocabulary is end, the entity
types, the `fragment` / `null` markers, and one pointer per word of the sentence. Exported as a
decoder-step graph with a key/value cache; the loop, beam search and parsing stay in the programs.

Not an architecture of its own: `vocabulary.py` (no torch) and `decoder.py` (torch) are used by
both architecture folders."""
