"""A model's graphs, all but the backbone, traced to TorchScript as it loads (the eager runtime's
`traced_heads`; serve's --traced-heads).

Eager torch releases the interpreter lock at every operator it dispatches and must then take it
back: beside a thread running Python (the event loop, the next batch's prepare) each operator of a
pass may wait a whole switch interval for it (`benchmarks/pass_anatomy.py` measures it;
docs/decisions/gpu-engine.md). A traced graph runs its operators from C++, taking the lock once a
call. So each word encoder's part after the backbone (pooling, the characters, the BiLSTM as
trained: its two directions, since packing branches on a batch's size) is traced, and each graph
that traces whole (`traced_whole`: span's proposal); the backbone stays as it is (on CUDA, replayed
from CUDA graphs). Traced once, on EXAMPLE_SENTENCES, with TorchScript's optimising executor off for
the process: it would specialise and fuse a graph again for each new batch shape, which a served
batch nearly always is (the served TorchScript runtime's long tail on a GPU, docs/gpu.md).

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

from nerserve.ner.encoder import WordEncoder
from nerserve.ner.examples import CHECK_SENTENCES, EXAMPLE_SENTENCES
from nerserve.ner.graph import GraphError
from nerserve.ner.torch_graph import EagerGraph


class AfterBackbone(nn.Module):
    """A word encoder's `after_backbone` as a module of its own, to trace."""

    def __init__(self, encoder: WordEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder.after_backbone(*inputs)


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
    holding = {name: _encoders(graph) for name, graph in graphs.items()}
    encoders = list({id(encoder): encoder for found in holding.values() for encoder in found}.values())
    whole = {name: graph for name, graph in graphs.items() if getattr(graph.module, "traced_whole", False)}
    encoder_inputs, graph_inputs = _example_inputs(program, encoders, whole)
    for encoder in encoders:
        if id(encoder) in encoder_inputs:  # a network may read its encoder's parts itself (gliner): left eager
            # its method, not the module: an attribute that is a module would become the encoder's submodule
            encoder.traced_after_backbone = traced(AfterBackbone(encoder), encoder_inputs[id(encoder)]).forward
    for name, graph in graphs.items():
        if name in whole:
            graph.module = traced(graph.module, graph_inputs[name])
            graph.execution_provider += ", traced to TorchScript"
        elif any(encoder.traced_after_backbone for encoder in holding[name]):
            graph.execution_provider += ", its word encoder after the backbone traced to TorchScript"
    differ = _differences(expected, [program.predict(sentences) for sentences in checks])
    if differ:
        raise GraphError(
            f"tracing the graphs changed the entities of {differ} of {sum(map(len, checks))} check sentences; "
            "serve without --traced-heads"
        )


def _differences(expected: list[list[Any]], found: list[list[Any]]) -> int:
    """How many sentences' entity sets differ, over lists of sentences' answers."""
    return sum(a != b for got, want in zip(found, expected, strict=True) for a, b in zip(got, want, strict=True))


def _encoders(graph: EagerGraph) -> list[WordEncoder]:
    return [part for part in graph.module.modules() if isinstance(part, WordEncoder)]


def _example_inputs(
    program: Any, encoders: list[WordEncoder], whole: dict[str, EagerGraph]
) -> tuple[dict[int, tuple[torch.Tensor, ...]], dict[str, tuple[torch.Tensor, ...]]]:
    """What each encoder's after_backbone, and each graph to trace whole, is first called with when
    PROGRAM runs EXAMPLE_SENTENCES."""
    encoder_inputs: dict[int, tuple[torch.Tensor, ...]] = {}
    graph_inputs: dict[str, tuple[torch.Tensor, ...]] = {}

    def recording(encoder: WordEncoder) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        def after_backbone(*inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            encoder_inputs.setdefault(id(encoder), inputs)
            return WordEncoder.after_backbone(encoder, *inputs)

        return after_backbone

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            graph_inputs.setdefault(name, inputs)

        return hook

    hooks = [graph.module.register_forward_pre_hook(record(name)) for name, graph in whole.items()]
    for encoder in encoders:
        encoder.traced_after_backbone = recording(encoder)
    try:
        program.run(program.prepare(EXAMPLE_SENTENCES))
    finally:
        for hook in hooks:
            hook.remove()
        for encoder in encoders:
            encoder.traced_after_backbone = None
    return encoder_inputs, graph_inputs
