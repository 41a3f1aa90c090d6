"""Build a trained model from its model-store folder: backbone + LoRA + heads → eager program."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ner.archs.span.config import SpanConfig
from ner.archs.span.network import SpanNetwork
from ner.archs.span.program import SpanProgram
from ner.backbone import BackboneInfo, resolve_backbone
from ner.encoder import load_backbone
from ner.lora import LoraSettings, add_lora, load_weights
from ner.model_store import WEIGHTS, Manifest, ModelStoreError, model_dir, read_manifest
from ner.signatures import SPAN_GRAPHS
from ner.text.subword import SubwordEncoder, load_tokenizer
from ner.torch_graph import EagerGraph


def device_name(requested: str | None = None) -> str:
    if requested:
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_span_network(config: SpanConfig, backbone: BackboneInfo, lora: LoraSettings) -> SpanNetwork:
    model = load_backbone(backbone)
    hidden = int(model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.d_model)
    return SpanNetwork(add_lora(model, lora), hidden, config)


def eager_program(network: SpanNetwork, backbone: BackboneInfo, device: str) -> SpanProgram:
    graphs = {name: EagerGraph(module, *SPAN_GRAPHS[name], device=device) for name, module in network.graphs().items()}
    return SpanProgram(graphs, network.config, SubwordEncoder(load_tokenizer(backbone.path)))


@dataclass
class LoadedModel:
    folder: Path
    manifest: Manifest
    backbone: BackboneInfo
    network: SpanNetwork
    program: SpanProgram


def load_model(name: str, device: str | None = None, backbone_path: str | None = None) -> LoadedModel:
    folder = model_dir(name)
    manifest = read_manifest(folder)
    if manifest.architecture != "span":
        raise ModelStoreError(f"{folder}: architecture {manifest.architecture!r} is not available in this build")
    backbone = resolve_backbone(backbone_path or manifest.backbone.name)
    if backbone.sha256 != manifest.backbone.sha256:
        raise ModelStoreError(
            f"{folder}: trained on backbone sha256 {manifest.backbone.sha256[:12]}…, "
            f"found {backbone.sha256[:12]}… at {backbone.path}"
        )
    config = SpanConfig.from_dict(manifest.config)
    network = build_span_network(config, backbone, LoraSettings.from_dict(manifest.lora))
    load_weights(network, folder / WEIGHTS)
    chosen = device_name(device)
    network.to(chosen).eval()
    return LoadedModel(folder, manifest, backbone, network, eager_program(network, backbone, chosen))
