"""nerserve: named entity recognition as a service. The one import name of the distribution:
`nerserve.ner` (models), `nerserve.export`, `nerserve.service`, `nerserve.loadtest`, and the
`nerserve.client` library; the command line in `nerserve.cli`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("nerserve")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
