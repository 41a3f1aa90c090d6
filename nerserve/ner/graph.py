"""The runtime-neutral graph interface: named arrays in, named arrays out, and the signatures
(names and named dynamic axes) every graph is exported and checked against.

Programs (ner.archs.<arch>.program) run graphs only through this protocol, so the same program
drives eager torch modules in training-time evaluation, and ONNX Runtime or TorchScript graphs in
export parity checks and in the service.

Decoders that loop carry a key/value cache from one step to the next. `run(..., keep_on_device=…)`
lets a runtime hand those outputs back as its own device values (an ONNX Runtime OrtValue or a
torch tensor on the GPU) that the next step takes as inputs unchanged, so a cache never makes a
host round trip per step; on CPU they are plain numpy arrays. Programs treat them as opaque.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

# A graph input or output: a numpy array, or (only for names kept on the device) a runtime's own
# device value that is passed back to the same runtime as it is.
Value = Any


class Graph(Protocol):
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    # Whether outputs can stay on the graph's device (a GPU; or ONNX Runtime's I/O binding on the
    # CPU, which tests take as the GPU path): there a program keeps intermediates on the device
    # between its graphs, and groups no rows by length.
    device_resident: bool
    # What it actually runs on: ONNX Runtime's provider after any fall-back, or the torch device.
    execution_provider: str

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]: ...


def execution_providers(graphs: Mapping[str, Graph]) -> dict[str, str]:
    """What each graph actually runs on, as its runtime says."""
    return {name: graph.execution_provider for name, graph in graphs.items()}


class GraphError(RuntimeError):
    """A graph that cannot be loaded or run: names the file or graph concerned."""


@dataclass(frozen=True)
class GraphSignature:
    """Input and output names of one graph and the named axes of each ("" marks a fixed axis).
    Axes listed in `may_be_empty` may have length 0 (a key/value cache before the first step).
    `derived_axes` sizes an output axis that no input has: an input axis's size plus a constant
    (the cache's present = past + 1; a pointer vocabulary = the words + the fixed tokens before
    them), or the constant alone where the source is "" (what a graph answers to zeros), so that a
    stand-in graph can answer the shapes the real one would."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    axes: Mapping[str, tuple[str, ...]]
    may_be_empty: frozenset[str] = field(default_factory=frozenset)
    derived_axes: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [name for name in (*self.inputs, *self.outputs) if name not in self.axes]
        if missing:
            raise ValueError(f"graph signature lacks the axes of {missing}")

    def check(self, graph: Graph, graph_name: str) -> None:
        """A loaded graph must have these outputs and no input but these (a stale export fails here).
        It may lack an input it does not read: a trace leaves those out (max pooling's subword_mask)."""
        if not set(graph.input_names) <= set(self.inputs) or set(graph.output_names) != set(self.outputs):
            raise GraphError(
                f"graph {graph_name!r} has inputs {list(graph.input_names)} and outputs {list(graph.output_names)}; "
                f"this version expects {list(self.inputs)} and {list(self.outputs)}"
            )


PAST, PRESENT = "past_", "present_"  # a step graph's cache inputs and outputs (KeyValueCache)


def present_of(past: str) -> str:
    """The output a step graph answers for its cache input `past` (the next step's `past`)."""
    return PRESENT + past.removeprefix(PAST)


@dataclass(frozen=True)
class KeyValueCache:
    """The per-layer key/value cache of a decoder step graph: inputs `past_key_<i>` /
    `past_value_<i>` and outputs `present_key_<i>` / `present_value_<i>`, each
    [rows, heads, positions, head_dim], only for the layers the config has."""

    layers: int
    heads: int
    head_dim: int
    rows_axis: str = "rows"

    @property
    def past(self) -> tuple[str, ...]:
        return tuple(f"{PAST}{kind}_{i}" for i in range(self.layers) for kind in ("key", "value"))

    @property
    def present(self) -> tuple[str, ...]:
        return tuple(present_of(name) for name in self.past)

    def axes(self) -> dict[str, tuple[str, ...]]:
        past = {name: (self.rows_axis, "", "past", "") for name in self.past}
        present = {name: (self.rows_axis, "", "present", "") for name in self.present}
        return {**past, **present}

    def empty(self, rows: int, dtype: type = np.float32) -> dict[str, np.ndarray]:
        """The cache before the first step: zero positions (a legal input of every step graph)."""
        return {name: np.zeros((rows, self.heads, 0, self.head_dim), dtype=dtype) for name in self.past}

    def carry(self, outputs: Mapping[str, Value]) -> dict[str, Value]:
        """A step's present keys/values as the next step's past (device values stay where they are)."""
        return {past: outputs[present] for past, present in zip(self.past, self.present, strict=True)}


def cross_names(layers: int) -> tuple[str, ...]:
    """A decoder's cross-attention keys and values, per layer: computed from the encoder's memory
    once per sentence, read by every step (`cross_key_<i>` / `cross_value_<i>`)."""
    return tuple(f"cross_{kind}_{i}" for i in range(layers) for kind in ("key", "value"))


def step_signature(
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    axes: Mapping[str, tuple[str, ...]],
    cache: KeyValueCache,
    derived_axes: Mapping[str, tuple[str, int]] | None = None,
) -> GraphSignature:
    """A decoder-step graph's signature: its own inputs/outputs plus the cache's, the past axis
    allowed to be empty (the first step), and each step one position longer than its past."""
    return GraphSignature(
        (*inputs, *cache.past),
        (*outputs, *cache.present),
        {**axes, **cache.axes()},
        frozenset({"past"}),
        {"present": ("past", 1), **(derived_axes or {})},
    )
