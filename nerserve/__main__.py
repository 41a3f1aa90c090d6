"""`python -m nerserve ...` is the `nerserve` command (used where the console script may not be on PATH)."""

from nerserve.cli import app

app()
