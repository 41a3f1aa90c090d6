"""nerserve's command line: the composition root above `ner` (models), `export` and `service`."""
