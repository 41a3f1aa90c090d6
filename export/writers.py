"""Write one torch module as an ONNX or TorchScript graph with named, dynamic axes.

ONNX uses the dynamo-based `torch.onnx.export(..., dynamo=True)`: it exports transformers' BERT
(whose mask construction the TorchScript-based exporter mis-traces into fixed shapes) with every
axis symbolic, checked by torch.export's shape guards rather than by a trace of one example. The
graph is saved as a single file (weights inlined) so one sha256 identifies it.
TorchScript uses `torch.jit.trace`; torch.jit is deprecated upstream, so it lives only here and
in service/runtime/torchscript.py, where a torch.export/AOTInductor path can replace it.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from nerserve.ner.graph import GraphSignature
from nerserve.ner.graph_format import TORCHSCRIPT_IO

OPSET = 18


def write_onnx(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path, signature: GraphSignature) -> None:
    """The example `args` must give every named axis a size of 2 or more (torch.export
    specialises sizes 0 and 1); axes the signature allows to be empty (a decoder's cache before
    its first step) are declared with a minimum of 0."""
    dims: dict[str, torch.export.Dim] = {}

    def dim(name: str) -> torch.export.Dim:
        if name not in dims:
            dims[name] = torch.export.Dim(name, min=0 if name in signature.may_be_empty else 1)
        return dims[name]

    inputs, outputs, axes = signature.inputs, signature.outputs, signature.axes
    dynamic = _by_argument(module, [{i: dim(axis) for i, axis in enumerate(axes[name]) if axis} for name in inputs])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            args,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_shapes=dynamic,
            dynamo=True,
            opset_version=OPSET,
            verbose=False,
        )
    assert program is not None
    model = program.model_proto
    # Shapes as the exporter annotates them may pin an axis to the example's size (the values are
    # right either way): drop intermediate annotations, and declare the outputs' named axes.
    del model.graph.value_info[:]
    for output in model.graph.output:
        for d, axis in zip(output.type.tensor_type.shape.dim, axes[output.name], strict=False):
            if axis:
                d.ClearField("dim_value")
                d.dim_param = axis
    onnx.save_model(model, str(path), save_as_external_data=False)


def _by_argument(module: nn.Module, shapes: list[dict[int, torch.export.Dim]]) -> tuple[Any, ...]:
    """Dynamic shapes in input order, grouped as `forward` takes them: a step graph whose layer
    count comes from its config takes its cache as `*past`, which torch.export sees as one tuple."""
    parameters = list(inspect.signature(module.forward).parameters.values())
    if not any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return tuple(shapes)
    named = sum(1 for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    return (*shapes[:named], tuple(shapes[named:]))


def write_torchscript(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path, signature: GraphSignature) -> None:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, args, check_trace=False, strict=False)
    names = json.dumps({"inputs": list(signature.inputs), "outputs": list(signature.outputs)})
    torch.jit.save(traced, str(path), _extra_files={TORCHSCRIPT_IO: names})


def fuse_transformer(path: Path) -> dict[str, int]:
    """ONNX Runtime's transformer optimizer, its pattern fusions only (opt_level 0: nothing tied to
    this machine's kernels is baked in), rewriting `path`; → the fused operators it made.

    On the span-conll03 encoder (2 cores, one thread, CoNLL test, packed batches of 32) it fuses the
    six GELUs with their biases (BiasGelu): 7.18 → 6.90 s. Attention is not fused: the dynamo
    exporter writes transformers' SDPA in a form its patterns do not match. Running ONNX shape
    inference first would let ORT fuse 13 SkipLayerNormalizations, but the graph is then 5 % slower
    (7.56 s), so it is not done. Parity against eager torch checks whatever it fused."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(path), model_type="bert", num_heads=0, hidden_size=0, opt_level=0, use_gpu=False)
    fused = {name: count for name, count in optimized.get_fused_operator_statistics().items() if count}
    optimized.save_model_to_file(str(path))
    return fused


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime dynamic quantization: int8 weights, activations quantized per batch at run time.
    MatMuls only: the character CNN as ConvInteger took 8.7 % of the INT8 encoder's time against
    2.2 % for its fp32 FusedConv."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        # ONNX shape inference types no output of a fused (com.microsoft) operator
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
