"""A model's graphs, all but the backbone, traced to TorchScript as it loads (the eager runtime's
`traced_heads`; serve's --traced-heads).

Eager torch releases the interpreter lock at every operator it dispatches and must then take it
back: beside a thread running Python (the event loop, the next batch's prepare) each operator of a
pass may wait a whole switch interval for it (`benchmarks/pass_anatomy.py` measures it;
docs/decisions/gpu-engine.md). A traced part runs its operators from C++, taking the lock once a
call. So each part of a graph that names itself traceable (`TRACED_PART`: the method, and what to
call it) is traced: each word encoder's part after the backbone (pooling, the characters, the BiLSTM
as trained: its two directions, since packing branches on a batch's size), and span's fused
proposal from its indices on (which its graph works out on the host first: `eager_indices`). The
backbone stays as it is (on CUDA, replayed from CUDA graphs). Traced once, on EXAMPLE_SENTENCES,
with TorchScript's optimising executor off for the process: it would specialise and fuse a graph
again for each new batch shape, which a served batch nearly always is (the served TorchScript
runtime's long tail on a GPU, docs/gpu.md). A traced part is called, not held as a submodule: the
owner's code calls `traced_part` where it is set.

The traced program must find what the eager one does: the entities of CHECK_SENTENCES (other sizes
on every axis), and of its first sentence alone, are compared at load; a difference is an error,
not a silent fall-back.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from nerserve.ner.examples import CHECK_SENTENCES, EXAMPLE_SENTENCES
from nerserve.ner.graph import GraphError
from nerserve.ner.torch_graph import EagerGraph


class TracedPart(nn.Module):
    """A module's traceable part (the method its TRACED_PART names) as a module of its own, to trace."""

    def __init__(self, owner: Any) -> None:
        super().__init__()
        self.owner = owner
        self.method = _untraced(owner)

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.method(self.owner, *inputs)


def traced(module: nn.Module, inputs: Sequence[torch.Tensor]) -> torch.jit.ScriptModule:
    # the tracer warns of every size check it keeps as a constant (the LSTM's own); whether the
    # trace holds at other sizes is what trace_heads checks
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return torch.jit.trace(module, tuple(inputs), check_trace=False)


def trace_heads(program: Any) -> None:
    """PROGRAM's eager graphs, all but the backbone, traced (see above); GraphError where the traced
    program finds other entities than the eager one."""
    checks = [CHECK_SENTENCES, CHECK_SENTENCES[:1]]
    expected = [program.predict(sentences) for sentences in checks]
    torch._C._set_graph_executor_optimize(False)
    graphs: dict[str, EagerGraph] = program.graphs
    holding = {name: parts_named(graph, "TRACED_PART") for name, graph in graphs.items()}
    parts = list({id(part): part for found in holding.values() for part in found}.values())
    inputs = _example_inputs(program, parts)
    for part in parts:
        if id(part) in inputs:  # a network may call its encoder's parts itself (gliner): left eager
            part.traced_part = traced(TracedPart(part), inputs[id(part)]).forward
    for name, graph in graphs.items():
        for part in holding[name]:
            if part.traced_part is not None:
                graph.execution_provider += f", {part.TRACED_PART[1]} traced to TorchScript"
    check_unchanged(checks, expected, [program.predict(sentences) for sentences in checks], "tracing", "--traced-heads")


def check_unchanged(
    checks: list[list[list[str]]], expected: list[list[Any]], found: list[list[Any]], doing: str, flag: str
) -> None:
    """GraphError where any of the CHECKS' sentences found other entities (FOUND, after DOING the
    graphs) than EXPECTED (the eager graphs'), naming the serve FLAG that asked for it."""
    differ = sum(a != b for got, want in zip(found, expected, strict=True) for a, b in zip(got, want, strict=True))
    if differ:
        raise GraphError(
            f"{doing} the graphs changed the entities of {differ} of {sum(map(len, checks))} check sentences; "
            f"serve without {flag}"
        )


def parts_named(graph: EagerGraph, attribute: str) -> list[Any]:
    """The modules of GRAPH whose class names a part of itself in ATTRIBUTE (TRACED_PART, COMPILED_PARTS)."""
    return [part for part in graph.module.modules() if hasattr(type(part), attribute)]


def _untraced(part: Any) -> Callable[..., Any]:
    """The method PART's class names as its traceable part, unbound."""
    method: Callable[..., Any] = getattr(type(part), part.TRACED_PART[0])
    return method


def _example_inputs(program: Any, parts: list[Any]) -> dict[int, tuple[torch.Tensor, ...]]:
    """What each traceable part is first called with when PROGRAM runs EXAMPLE_SENTENCES."""
    inputs: dict[int, tuple[torch.Tensor, ...]] = {}

    def recording(part: Any) -> Callable[..., Any]:
        method = _untraced(part)

        def first_call_kept(*called: torch.Tensor) -> Any:
            inputs.setdefault(id(part), called)
            return method(part, *called)

        return first_call_kept

    for part in parts:
        part.traced_part = recording(part)
    try:
        program.run(program.prepare(EXAMPLE_SENTENCES))
    finally:
        for part in parts:
            part.traced_part = None
    return inputs
