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
at. A part is compiled where it is first called: here, on COMPILE_CHECKS, whose batches make every
variant torch.compile still makes with the settings below (a lone sentence, a one-word one, the
strides of their inputs), so that no request waits for a compile.

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
from nerserve.ner.traced_heads import check_unchanged, parts_named

# a lone sentence, several, and a one-word sentence: between them, every variant torch.compile makes
# of a part (below) is compiled at load, not when a request first brings it
COMPILE_CHECKS = [CHECK_SENTENCES, CHECK_SENTENCES[:1], [["Germany"]]]
# a few variants a part, for each model a process serves
RECOMPILE_LIMIT = 64


def compile_heads(program: Any) -> None:
    """PROGRAM's eager graphs' compilable parts compiled (see above); GraphError where the compiled
    program finds other entities than the eager one or cannot be compiled."""
    expected = [program.predict(sentences) for sentences in COMPILE_CHECKS]
    _compile_for_any_batch()
    graphs: dict[str, EagerGraph] = program.graphs
    holding = {name: parts_named(graph, "COMPILED_PARTS") for name, graph in graphs.items()}
    for part in {id(part): part for parts in holding.values() for part in parts}.values():
        for method in type(part).COMPILED_PARTS:
            setattr(part, method, compiled(getattr(part, method)))
    for name, graph in graphs.items():
        if holding[name]:
            methods = sorted({method for part in holding[name] for method in part.COMPILED_PARTS})
            graph.execution_provider += f", {' and '.join(methods)} compiled"
    try:
        found = [program.predict(sentences) for sentences in COMPILE_CHECKS]
    except Exception as error:  # torch.compile's own errors (a missing compiler, Triton) have no common base
        raise GraphError(
            f"torch.compile could not compile the graphs on {_device(graphs)} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); serve without --compiled-heads"
        ) from error
    check_unchanged(COMPILE_CHECKS, expected, found, "compiling", "--compiled-heads")


def _compile_for_any_batch() -> None:
    """torch.compile's settings for this process: graphs that hold for a served batch's sizes,
    whatever they are."""
    # span's filter keeps the seeds it passes (`nonzero`): in the graph, not a break out of it
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    # sizes that happen to be equal in one batch (words and characters) are not equal in the next
    torch.fx.experimental._config.use_duck_shape = False
    # a size of one (a lone sentence, a one-word one) runs the general graph, not one of its own
    torch.fx.experimental._config.backed_size_oblivious = True
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


def compiled(method: Callable[..., Any]) -> Callable[..., Any]:
    """METHOD compiled for dynamic shapes, on its first call."""
    return torch.compile(method, dynamic=True)


def _device(graphs: dict[str, EagerGraph]) -> str:
    return str(next(iter(graphs.values())).device)
