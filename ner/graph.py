"""The runtime-neutral graph interface: named numpy arrays in, named numpy arrays out.

Programs (ner.archs.<arch>.program) run graphs only through this protocol, so the same program
drives eager torch modules in training-time evaluation, and ONNX Runtime or TorchScript graphs in
export parity checks and in the service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np


class Graph(Protocol):
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class GraphError(RuntimeError):
    """A graph that cannot be loaded or run: names the file or graph concerned."""
