"""Build a trained model from its model-store folder: backbone + LoRA + heads → eager program."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ner.archs.diffusion.config import DiffusionConfig
from ner.archs.diffusion.network import DiffusionNetwork
from ner.archs.nag.config import NagConfig
from ner.archs.nag.network import NagNetwork
from ner.archs.registry import architecture
from ner.archs.span.config import SpanConfig
from ner.archs.span.network import SpanNetwork
from ner.backbone import BackboneInfo, resolve_backbone
from ner.encoder import load_backbone
from ner.lora import LoraSettings, add_lora, load_weights
from ner.model_store import WEIGHTS, Manifest, ModelStoreError, model_dir, read_manifest
from ner.text.subword import SubwordEncoder, load_tokenizer
from ner.torch_graph import EagerGraph

# architecture → (config from its manifest dict, network class); the torch side of the registry
NETWORKS: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[[nn.Module, int, Any], nn.Module]]] = {
    "span": (SpanConfig.from_dict, SpanNetwork),
    "nag": (NagConfig.from_dict, NagNetwork),
    "diffusion": (DiffusionConfig.from_dict, DiffusionNetwork),
}


def device_name(requested: str | None = None) -> str:
    if requested:
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_network(arch: str, config: Any, backbone: BackboneInfo, lora: LoraSettings) -> Any:
    model = load_backbone(backbone)
    hidden = int(model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.d_model)
    return NETWORKS[arch][1](add_lora(model, lora), hidden, config)


def eager_program(arch: str, network: Any, backbone: BackboneInfo, device: str) -> Any:
    spec = architecture(arch)
    graphs = {name: EagerGraph(module, *spec.graphs[name], device=device) for name, module in network.graphs().items()}
    return spec.build_program(graphs, network.config.to_dict(), SubwordEncoder(load_tokenizer(backbone.path)))


@dataclass
class LoadedModel:
    folder: Path
    manifest: Manifest
    backbone: BackboneInfo
    network: Any
    program: Any


def load_model(name: str, device: str | None = None, backbone_path: str | None = None) -> LoadedModel:
    folder = model_dir(name)
    manifest = read_manifest(folder)
    if manifest.architecture not in NETWORKS:
        raise ModelStoreError(f"{folder}: architecture {manifest.architecture!r} is not available in this build")
    backbone = resolve_backbone(backbone_path or manifest.backbone.name)
    if backbone.sha256 != manifest.backbone.sha256:
        raise ModelStoreError(
            f"{folder}: trained on backbone sha256 {manifest.backbone.sha256[:12]}…, "
            f"found {backbone.sha256[:12]}… at {backbone.path}"
        )
    config = NETWORKS[manifest.architecture][0](manifest.config)
    network = build_network(manifest.architecture, config, backbone, LoraSettings.from_dict(manifest.lora))
    load_weights(network, folder / WEIGHTS)
    chosen = device_name(device)
    network.to(chosen).eval()
    return LoadedModel(folder, manifest, backbone, network, eager_program(manifest.architecture, network, backbone, chosen))
