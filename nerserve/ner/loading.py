"""Build a trained model from its model-store folder: backbone + LoRA + heads → eager program."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nerserve.ner.archs.base import ArchitectureSpec
from nerserve.ner.archs.registry import architecture
from nerserve.ner.backbone import BackboneInfo, resolve_backbone
from nerserve.ner.encoder import load_backbone
from nerserve.ner.lora import LoraSettings, add_lora, load_weights, merge_adapters
from nerserve.ner.model_store import WEIGHTS, Manifest, ModelStoreError, read_manifest
from nerserve.ner.text.subword import SubwordEncoder, load_tokenizer
from nerserve.ner.torch_graph import EagerGraph, half_dtype


def device_name(requested: str | None = None) -> str:
    if requested:
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def lazy(reference: str) -> Any:
    """`module:attribute` → the attribute (torch-side pieces of a spec are imported only here)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def build_network(spec: ArchitectureSpec[Any, Any], config: Any, backbone: BackboneInfo, lora: LoraSettings) -> Any:
    model = load_backbone(backbone)
    hidden = int(model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.d_model)
    network: nn.Module = lazy(spec.network)(add_lora(model, lora), hidden, config)
    return network


def eager_program(
    spec: ArchitectureSpec[Any, Any], network: Any, backbone: BackboneInfo, device: str, precision: str = "fp32"
) -> Any:
    """The architecture's program over the network's own modules (training-time evaluation, the
    reference side of export parity, and the eager runtime). `precision` fp16 or bf16: the
    network's weights are in it already (`load_model`); its graphs cast their feeds to match."""
    signatures = spec.signatures(network.config)
    graphs = {
        # a graph wrapping parts of the network is a module made now, in train mode: it takes the
        # network's, so that a served graph is run as it is rather than put in eval mode and back at
        # every call (`EagerGraph._run_in_eval_mode`), which left its parts in train mode between calls
        name: EagerGraph(module.train(network.training), signatures[name].inputs, signatures[name].outputs, device, precision)
        for name, module in network.graphs().items()
    }
    return spec.build_program(graphs, network.config, SubwordEncoder(load_tokenizer(backbone.path)))


def fuse_for_eager(network: nn.Module) -> None:
    """Each part of NETWORK that has an inference-only form dispatching fewer operators takes it
    (the BiLSTM's directions as one packed call, span's scorers' products as one): where Python
    dispatches each operator, as the eager runtime does on a GPU, each one saved is a kernel launch
    saved. Exported graphs keep the trained form: their runtime fuses on its own, and on the CPU
    ONNX Runtime ran span's fused products slower (docs/decisions/cpu-inference.md)."""
    each_part_that_can(network, "fuse_for_eager")
    skip_dropouts(network)


class InferenceDropout(nn.Dropout):
    """A dropout at inference, where it changes nothing: its input, without the call into torch a
    dropout in eval mode still makes (which lets the interpreter lock go, and an eager pass on a GPU
    then waits to get it back: docs/decisions/gpu-engine.md). A dropout still, so that code reading
    its rate (`p`) finds it."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input


def skip_dropouts(network: nn.Module) -> None:
    """Every dropout of NETWORK (its backbone's and its heads') an InferenceDropout."""
    for module in list(network.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                setattr(module, name, InferenceDropout(child.p, child.inplace))


def each_part_that_can(network: nn.Module, method: str) -> None:
    """Every part of NETWORK with an inference-only METHOD calls it (fuse_for_eager; the encoders'
    replay_from_cuda_graphs, ner.cuda_graphs)."""
    for module in list(network.modules()):
        call = getattr(module, method, None)
        if callable(call):
            call()


@dataclass
class LoadedModel:
    folder: Path
    manifest: Manifest
    spec: ArchitectureSpec[Any, Any]
    backbone: BackboneInfo
    network: Any
    program: Any


def load_model(
    folder: Path,
    device: str | None = None,
    backbone_path: str | None = None,
    precision: str = "fp32",
    merged: bool = False,
    cuda_graphs: bool = False,
    traced_heads: bool = False,
    compiled_heads: bool = False,
) -> LoadedModel:
    """The trained model in FOLDER (a model store's entry) as eager torch; `precision` fp16 or bf16:
    its weights converted to that type once, here. `merged`: loaded for inference, LoRA folded into
    the backbone's weights (a third fewer kernels a layer, which on a GPU is most of a small
    batch's time) and its parts in their fused forms (fuse_for_eager). Neither can be trained on
    or exported. `cuda_graphs` (merged, on CUDA): the backbone's pass replayed from CUDA graphs,
    captured here (ner.cuda_graphs). `traced_heads` (merged): its graphs, all but the backbone, traced
    to TorchScript here and checked against the eager ones (ner.traced_heads); `compiled_heads`
    (merged): compiled by torch.compile instead, and checked alike (ner.compiled_heads)."""
    chosen = device_name(device)
    if cuda_graphs and not (merged and chosen.startswith("cuda")):
        raise ValueError(f"CUDA graphs are for a model loaded merged on CUDA (asked for {chosen}, merged={merged})")
    if (traced_heads or compiled_heads) and not merged:
        raise ValueError("traced or compiled heads are for a model loaded merged, for inference")
    if traced_heads and compiled_heads:
        raise ValueError("a model's heads are traced or compiled, not both")
    manifest = read_manifest(folder)
    try:
        spec = architecture(manifest.architecture)
    except ValueError as error:
        raise ModelStoreError(f"{folder}: {error}") from None
    backbone = resolve_backbone(backbone_path or manifest.backbone.name)
    if backbone.sha256 != manifest.backbone.sha256:
        raise ModelStoreError(
            f"{folder}: trained on backbone sha256 {manifest.backbone.sha256[:12]}…, "
            f"found {backbone.sha256[:12]}… at {backbone.path}"
        )
    network = build_network(spec, spec.config_from(manifest.config), backbone, LoraSettings.from_dict(manifest.lora))
    load_weights(network, folder / WEIGHTS)
    if merged:
        network = merge_adapters(network)
        fuse_for_eager(network)
    network.to(chosen, half_dtype(precision)).eval()
    if cuda_graphs:
        each_part_that_can(network, "replay_from_cuda_graphs")
    program = eager_program(spec, network, backbone, chosen, precision)
    if traced_heads:
        from nerserve.ner.traced_heads import trace_heads

        trace_heads(program)
    if compiled_heads:
        from nerserve.ner.compiled_heads import compile_heads

        compile_heads(program)
    return LoadedModel(folder, manifest, spec, backbone, network, program)
