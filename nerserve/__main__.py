"""`python -m nerserve ...` is the `nerserve` command (used where the console script may not be on PATH)."""

from nerserve.cli import app

if __name__ == "__main__":  # not when a start-up export process re-imports the parent's main module
    app()
