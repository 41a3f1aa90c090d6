"""Text handling: words with character offsets, sub-word tokenisation, character features."""
