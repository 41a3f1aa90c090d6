"""The weight average of two trained runs of one model (a "model soup", Wortsman et al. 2022): where
two consecutive runs of one recipe tie on dev, their average can score above both. Whether it does
is decided on dev, like any promotion (`nerserve tune` re-chooses decoding and re-scores it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from nerserve.ner.model_store import (
    WEIGHTS,
    Manifest,
    ModelStoreError,
    read_manifest,
    weights_version,
    write_manifest,
)

# down- and up-projections: peft's adapters, and the gner decoder's own low-rank deltas
LORA_PAIRS = (("lora_A", "lora_B"), ("lora_a", "lora_b"))


class AverageError(ModelStoreError):
    """The two models cannot be averaged (different architecture, labels, adapters or tensors)."""


def lora_partner(name: str) -> str | None:
    """The up-projection (B) paired with a LoRA down-projection (A) tensor name, else None."""
    for down, up in LORA_PAIRS:
        if down in name:
            return name.replace(down, up)
    return None


def average_low_rank(
    first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray], weight: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """(A, B) whose product B·A is the best rank-r approximation of weight·B1·A1 + (1−weight)·B2·A2
    — averaging A and B one by one would not average the adapters' deltas — and the share of the
    averaged delta's energy that the cut to rank r dropped."""
    (a1, b1), (a2, b2) = ((a.astype(np.float64), b.astype(np.float64)) for a, b in (first, second))
    delta = weight * b1 @ a1 + (1.0 - weight) * b2 @ a2
    rank = a1.shape[0]
    u, s, vt = np.linalg.svd(delta, full_matrices=False)
    total = float((s**2).sum())
    dropped = float(np.sqrt((s[rank:] ** 2).sum() / total)) if total > 0 else 0.0
    root = np.sqrt(s[:rank])
    return (root[:, None] * vt[:rank]).astype(first[0].dtype), (u[:, :rank] * root).astype(first[1].dtype), dropped


def average_tensors(
    first: Mapping[str, np.ndarray], second: Mapping[str, np.ndarray], weight: float
) -> tuple[dict[str, np.ndarray], float]:
    """weight·first + (1−weight)·second, tensor by tensor (LoRA pairs by their deltas), and the largest
    share of a delta's energy dropped by the cut back to the adapters' rank."""
    if first.keys() != second.keys():
        raise AverageError(f"the weights hold different tensors: {sorted(first.keys() ^ second.keys())[:5]}")
    up_projections = {up for up in map(lora_partner, first) if up is not None}  # written with their A
    averaged: dict[str, np.ndarray] = {}
    worst = 0.0
    for name, value in first.items():
        if value.shape != second[name].shape:
            raise AverageError(f"tensor {name}: shape {value.shape} against {second[name].shape}")
        up = lora_partner(name)
        if up is not None:
            down_avg, up_avg, dropped = average_low_rank((value, first[up]), (second[name], second[up]), weight)
            averaged[name], averaged[up], worst = down_avg, up_avg, max(worst, dropped)
        elif name not in up_projections:
            mixed = weight * value.astype(np.float32) + (1.0 - weight) * second[name].astype(np.float32)
            averaged[name] = np.asarray(mixed, dtype=value.dtype)  # a 0-d tensor's arithmetic gives a scalar
    return averaged, worst


def check_compatible(first: Manifest, second: Manifest) -> None:
    for field in ("architecture", "labels", "backbone", "lora"):
        if getattr(first, field) != getattr(second, field):
            raise AverageError(
                f"the two models differ in {field}: {getattr(first, field)!r} against {getattr(second, field)!r}"
            )


def average_models(first_dir: Path, second_dir: Path, out: Path, weight: float = 0.5) -> Manifest:
    """Write the weight average of two models of one architecture to `out`. The manifest is the first
    model's (its config, decoding and training history: pass the later run first) with the average
    recorded under training.weight_average; its scores are dropped until `nerserve tune` re-scores it."""
    if not 0.0 < weight < 1.0:
        raise AverageError(f"weight {weight}: must lie strictly between 0 and 1")
    first_manifest, second_manifest = read_manifest(first_dir), read_manifest(second_dir)
    check_compatible(first_manifest, second_manifest)
    tensors, dropped = average_tensors(load_file(str(first_dir / WEIGHTS)), load_file(str(second_dir / WEIGHTS)), weight)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS))
    training = dict(first_manifest.training)
    training["weight_average"] = {
        "of": [f"{m.name} {m.version}" for m in (first_manifest, second_manifest)],
        "weight": weight,
        "lora_energy_dropped": dropped,
    }
    manifest = first_manifest.model_copy(
        update={
            "name": out.name,
            "version": weights_version(out / WEIGHTS),
            "training": training,
            "scores": {},
        }
    )
    write_manifest(out, manifest)
    return manifest
