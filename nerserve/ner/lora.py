"""LoRA over the frozen backbone (peft), and the small trainable checkpoint: adapters + heads, fp16."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0  # LoRA dropout samples a mask per linear layer: slow on CPU, little gain
    target_modules: str | tuple[str, ...] = "all-linear"

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if isinstance(self.target_modules, tuple):
            values["target_modules"] = list(self.target_modules)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LoraSettings:
        values = dict(values)
        if isinstance(values.get("target_modules"), list):
            values["target_modules"] = tuple(values["target_modules"])
        return cls(**values)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def add_lora(backbone: nn.Module, settings: LoraSettings) -> nn.Module:
    """Freeze the backbone and wrap it with LoRA adapters (only they train)."""
    targets: str | list[str] = (
        settings.target_modules if isinstance(settings.target_modules, str) else list(settings.target_modules)
    )
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, target_modules=targets)
    return get_peft_model(backbone, config)  # type: ignore[arg-type]


def trainable_state(network: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in network.named_parameters() if p.requires_grad}


def save_weights(network: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Only what training changed (LoRA adapters + heads), as fp16: a few MB. Negative zeros are
    written as zeros, so that equal tensors make equal files (a model's version is the file's
    digest, and an optimiser step of size 0 can flip the sign of a zero)."""
    state = {name: (t.to(torch.float16) + 0.0).contiguous().cpu() for name, t in trainable_state(network).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata=metadata)


class WeightsError(ValueError):
    pass


def load_weights(network: nn.Module, path: Path) -> None:
    try:
        state = load_file(str(path))
    except FileNotFoundError:
        raise WeightsError(f"{path}: missing weights file") from None
    except Exception as error:  # safetensors raises its own error types for corrupt headers
        raise WeightsError(f"{path}: unreadable safetensors file ({error})") from None
    expected = trainable_state(network)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise WeightsError(f"{path}: weights do not fit the architecture (missing {missing[:3]}, unexpected {unexpected[:3]})")
    with torch.no_grad():
        params = dict(network.named_parameters())
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise WeightsError(f"{path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(params[name].shape)}")
            params[name].copy_(tensor.to(params[name].dtype))


def merge_adapters(network: ModuleT) -> ModuleT:
    """Every peft-wrapped backbone in the network with its LoRA folded into the weights (where it
    sits differs by architecture: the shared encoder's backbone, or GNER's own)."""
    from peft import PeftModel

    wrapped = [name for name, module in network.named_modules() if isinstance(module, PeftModel)]
    for name in wrapped:
        owner_name, _, attribute = name.rpartition(".")
        owner = network.get_submodule(owner_name) if owner_name else network
        setattr(owner, attribute, getattr(owner, attribute).merge_and_unload())
    for module in network.modules():  # an architecture's own low-rank deltas (gner's decoder)
        fold = getattr(module, "fold", None)
        if callable(fold):
            fold()
    return network
