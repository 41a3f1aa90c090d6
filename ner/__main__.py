"""`python -m ner ...` is the `nerserve` command (used where the console script may not be on PATH)."""

from ner.cli import app

app()
