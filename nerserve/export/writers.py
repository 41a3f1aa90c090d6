"""Write one torch module as an ONNX or TorchScript graph with named, dynamic axes.

ONNX: traced by the TorchScript-based exporter (seconds), checked at other sizes, and exported by
torch.export (`dynamo=True`, every axis symbolic, shape guards instead of one example's trace)
where the trace kept a size as a constant; see write_onnx. The graph is saved as a single file
(weights inlined) so one sha256 identifies it.
TorchScript uses `torch.jit.trace`; torch.jit is deprecated upstream, so it lives only here and
in ner/runtime/torchscript.py, where a torch.export/AOTInductor path can replace it.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from nerserve.ner.graph import GraphSignature
from nerserve.ner.graph_format import TORCHSCRIPT_IO

OPSET = 18
TRACED = "torch.onnx.export(dynamo=False)"
DYNAMO = "torch.onnx.export(dynamo=True)"


def write_onnx(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    signature: GraphSignature,
    *,
    check_args: tuple[torch.Tensor, ...],
) -> str:
    """→ which exporter wrote the graph. The TorchScript-based exporter (`dynamo=False`) first: it
    writes a graph several times faster than torch.export, and a first start exports every model
    before it serves it. A trace keeps as constants whatever Python computed from a size
    (DiffusionNER's cross-attention reshapes by batch × proposals), so the traced graph is run on
    `check_args`, inputs of other sizes, against the module itself; when that fails or differs,
    the graph is exported by torch.export, whose symbolic shapes refuse such constants. Parity
    on real batches still checks either."""
    try:
        _write_traced_onnx(module, args, path, signature)
        _check_other_sizes(module, path, signature, check_args)
        exporter = TRACED
    except Exception:  # a trace that fails or bakes in a size: export the checked way
        _write_dynamo_onnx(module, args, path, signature)
        exporter = DYNAMO
    model = onnx.load_model(str(path))
    # Shapes as the exporter annotates them may pin an axis to the example's size (the values are
    # right either way): drop intermediate annotations, and declare the outputs' named axes.
    del model.graph.value_info[:]
    for output in model.graph.output:
        for d, axis in zip(output.type.tensor_type.shape.dim, signature.axes[output.name], strict=False):
            if axis:
                d.ClearField("dim_value")
                d.dim_param = axis
    onnx.save_model(model, str(path), save_as_external_data=False)
    return exporter


class TraceMismatch(RuntimeError):
    pass


def _check_other_sizes(module: nn.Module, path: Path, signature: GraphSignature, args: tuple[torch.Tensor, ...]) -> None:
    """The graph's outputs on `args` have the module's shapes and, for floats, its values (1e-3:
    this looks for sizes kept as constants, not for rounding)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # a failure here is an answer (DYNAMO then), not an error to log
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    # a trace leaves out an input the module does not read (max pooling's subword_mask); the
    # runtimes feed a graph only the inputs it declares
    declared = {graph_input.name for graph_input in session.get_inputs()}
    feed = {name: arg.numpy() for name, arg in zip(signature.inputs, args, strict=True) if name in declared}
    got = session.run(list(signature.outputs), feed)
    with torch.no_grad():
        expected = module(*args)
    expected_list = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    for name, value, reference in zip(signature.outputs, got, expected_list, strict=True):
        wanted = reference.numpy()
        if value.shape != wanted.shape:
            raise TraceMismatch(f"{name}: shape {value.shape} where the module gives {wanted.shape}")
        if wanted.dtype.kind == "f" and not np.allclose(value, wanted, atol=1e-3, rtol=1e-3):
            raise TraceMismatch(f"{name}: values differ by up to {float(np.abs(value - wanted).max()):.2e}")


def _write_traced_onnx(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path, signature: GraphSignature) -> None:
    names = (*signature.inputs, *signature.outputs)
    dynamic = {name: {i: axis for i, axis in enumerate(signature.axes[name]) if axis} for name in names}
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # its fused kernel has no ONNX form
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=list(signature.inputs),
                output_names=list(signature.outputs),
                dynamic_axes=dynamic,
                dynamo=False,
                opset_version=OPSET,
            )
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)


def _write_dynamo_onnx(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path, signature: GraphSignature) -> None:
    """The example `args` must give every named axis a size of 2 or more (torch.export
    specialises sizes 0 and 1); axes the signature allows to be empty (a decoder's cache before
    its first step) are declared with a minimum of 0."""
    dims: dict[str, torch.export.Dim] = {}

    def dim(name: str) -> torch.export.Dim:
        if name not in dims:
            dims[name] = torch.export.Dim(name, min=0 if name in signature.may_be_empty else 1)
        return dims[name]

    inputs, axes = signature.inputs, signature.axes
    dynamic = _by_argument(module, [{i: dim(axis) for i, axis in enumerate(axes[name]) if axis} for name in inputs])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            args,
            input_names=list(inputs),
            output_names=list(signature.outputs),
            dynamic_shapes=dynamic,
            dynamo=True,
            opset_version=OPSET,
            verbose=False,
        )
    assert program is not None
    onnx.save_model(program.model_proto, str(path), save_as_external_data=False)


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
    six GELUs with their biases (BiasGelu): 7.18 → 6.90 s, and their layer norms. Its attention
    patterns match nothing in these graphs (export.json's `fusions` lists what each export got).
    Running ONNX shape inference first would let ORT fuse 13 SkipLayerNormalizations, but the graph
    is then 5 % slower (7.56 s), so it is not done. Parity against eager torch checks whatever it
    fused."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    # Patterns that match nothing in these graphs are not searched for: attention (and its
    # rotary and quantised forms) and the embedding's layer norm. The graphs come out byte for
    # byte the same, a second or so sooner (every model's first start pays it).
    options = FusionOptions("bert")
    options.enable_attention = options.enable_rotary_embeddings = False
    options.enable_embed_layer_norm = options.enable_qordered_matmul = False
    # It reports, in a print and warnings, the shape inference it cannot do on these graphs: what
    # the docstring says is skipped on purpose, so nothing to tell a user (nor to print on stdout,
    # where `nerserve export --json` writes, nor bare into a server's structured log).
    with contextlib.redirect_stdout(io.StringIO()), warnings_logged_off():
        optimized = optimize_model(
            str(path), model_type="bert", num_heads=0, hidden_size=0, optimization_options=options, opt_level=0, use_gpu=False
        )
    fused = {name: count for name, count in optimized.get_fused_operator_statistics().items() if count}
    optimized.save_model_to_file(str(path))
    return fused


@contextlib.contextmanager
def warnings_logged_off() -> Iterator[None]:
    """No log record below ERROR while inside, from any logger: ONNX Runtime's transformer tools
    name their loggers after their modules alone (`fusion_skiplayernorm`, `onnx_model`, …), so
    there is no parent logger of theirs to quieten."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def quantize_int8(source: Path, target: Path) -> None:
    """ONNX Runtime dynamic quantization: int8 weights, activations quantized per batch at run time.
    MatMuls (the products with activations; the character CNN's tables, an einsum of two weights,
    are left to constant folding in fp32) and the word BiLSTM's LSTMs, which were a tenth of the
    INT8 encoder's time in fp32 (docs/decisions/cpu-inference.md). A scale per output
    channel rather than per weight matrix keeps more of fp32's F1 at the same speed."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # It warns of each tensor whose type ONNX shape inference cannot give (what DefaultTensorType
    # answers) and advises its pre-processing (shape inference and its own fusions, which
    # fuse_transformer leaves out on purpose): nothing to tell a user of each export.
    with warnings_logged_off():
        quantize_dynamic(
            str(source),
            str(target),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "LSTM"],
            per_channel=True,
            # ONNX shape inference types no output of a fused (com.microsoft) operator
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
