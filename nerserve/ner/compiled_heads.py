"""A model's graphs, all but the backbone and the BiLSTM, compiled by torch.compile as it loads (the
eager runtime's `compiled_heads`; serve's --compiled-heads).

On a GPU an eager pass is bound by Python launching its kernels, one operator at a time, each
operator letting the interpreter lock go and taking it back (docs/gpu.md; ner.traced_heads). The
backbone is replayed from CUDA graphs; the heads' operators are still launched one by one. Inductor
fuses a part's pointwise and indexing operators into a few kernels that its generated code
launches. Each part of a graph that names itself compilable (`COMPILED_PARTS`: methods) is compiled
for dynamic shapes, since a served batch's sizes change from batch to batch: the word encoders'
inputs to the BiLSTM (torch.compile does not compile RNNs; the BiLSTM stays one cuDNN call) and
span's fused proposal, its filter's `nonzero` captured into the compiled graph rather than broken
at. A part is compiled where it is first called: here, on the check sentences (one sentence, and
several), then in the warm-up passes; a size torch.compile specialises (one, on an axis not yet seen
at one) compiles once more when it first comes.

The compiled program must find what the eager one does on CHECK_SENTENCES, as the traced one must;
a difference is an error, and so is a device torch.compile cannot compile for (on a GPU it needs
Triton; on the CPU a C++ compiler): the model fails to load, saying so, rather than running eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nerserve.ner.examples import CHECK_SENTENCES
from nerserve.ner.graph import GraphError
from nerserve.ner.torch_graph import EagerGraph
from nerserve.ner.traced_heads import entity_differences

# each model's parts compile their own graphs (guarded on the module), several models a process
RECOMPILE_LIMIT = 64


def compile_heads(program: Any) -> None:
    """PROGRAM's eager graphs' compilable parts compiled (see above); GraphError where the compiled
    program finds other entities than the eager one or cannot be compiled."""
    checks = [CHECK_SENTENCES, CHECK_SENTENCES[:1], [["Germany"]]]
    expected = [program.predict(sentences) for sentences in checks]
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    torch.fx.experimental._config.use_duck_shape = False
    torch.fx.experimental._config.backed_size_oblivious = True
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    graphs: dict[str, EagerGraph] = program.graphs
    done: set[int] = set()
    for graph in graphs.values():
        parts = _compilable_parts(graph)
        for part in parts:
            if id(part) not in done:
                done.add(id(part))
                for method in type(part).COMPILED_PARTS:
                    setattr(part, method, compiled(getattr(part, method)))
        if parts:
            graph.execution_provider += ", " + " and ".join(sorted({m for p in parts for m in p.COMPILED_PARTS})) + " compiled"
    try:
        found = [program.predict(sentences) for sentences in checks]
    except Exception as error:  # torch.compile's own errors (a missing compiler, Triton) have no common base
        raise GraphError(
            f"torch.compile could not compile the graphs on {_device(graphs)} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); serve without --compiled-heads"
        ) from error
    differ = entity_differences(expected, found)
    if differ:
        raise GraphError(
            f"compiling the graphs changed the entities of {differ} of {sum(map(len, checks))} check sentences; "
            "serve without --compiled-heads"
        )


def compiled(method: Callable[..., Any]) -> Callable[..., Any]:
    """METHOD compiled for dynamic shapes, on its first call."""
    return torch.compile(method, dynamic=True)


def _device(graphs: dict[str, EagerGraph]) -> str:
    return str(next(iter(graphs.values())).device)


def _compilable_parts(graph: EagerGraph) -> list[Any]:
    return [part for part in graph.module.modules() if hasattr(type(part), "COMPILED_PARTS")]
