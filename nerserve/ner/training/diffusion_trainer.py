"""Train DiffusionNER with the shared loop (ner.training.loop), then choose φ on dev."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nerserve.ner.archs.diffusion import SPEC
from nerserve.ner.archs.diffusion.config import DiffusionConfig, DiffusionDecodeOptions, Schedule
from nerserve.ner.archs.diffusion.loss import diffusion_loss
from nerserve.ner.archs.diffusion.program import DiffusionProgram
from nerserve.ner.archs.diffusion.schedule import Sampler
from nerserve.ner.data import label_set
from nerserve.ner.decoding.overlap import Overlap
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.model_store import Manifest
from nerserve.ner.training.decode_tuning import tune_spec
from nerserve.ner.training.loop import (
    ModelRecord,
    Trained,
    TrainSettings,
    fit,
    is_nested,
    start_run,
    tune_and_finish,
    warm_start,
)


def train_diffusion(
    data_dir: Path, out: Path, settings: TrainSettings, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    run = start_run(data_dir, settings, backbone_spec, device)
    torch_device, train, dev, backbone, lora = run.device, run.train, run.dev, run.backbone, run.lora
    nested = is_nested(train)
    overlap: Overlap = "nested" if nested else "flat"
    # the official configs: cosine schedule + mean span pooling for GENIA (nested), linear +
    # boundary-concatenation for CoNLL-2003 (flat)
    schedule: Schedule = "cosine" if nested else "linear"
    config = DiffusionConfig(
        labels=tuple(label_set(train)),
        schedule=schedule,
        span_pooling="mean" if nested else "lrconcat",
        decode=DiffusionDecodeOptions(overlap=overlap),
    )
    network = build_network(SPEC, config, backbone, lora).to(torch_device)
    initialised = warm_start(network, settings.init_from, backbone, SPEC.name) if settings.init_from else {}
    program: DiffusionProgram = eager_program(SPEC, network, backbone, torch_device)
    extra = {"warm_start": initialised} if initialised else {}
    record = ModelRecord(out.name, SPEC.name, config.to_dict(), backbone, lora, data_dir, settings, extra, run.words)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(
        f"diffusion: {len(train)} train / {len(dev)} dev sentences, labels {list(config.labels)}, overlap {overlap}, "
        f"schedule {schedule}, K {config.train_proposals}, {trainable:,} trainable parameters, device {torch_device}",
        flush=True,
    )
    sampler = Sampler(config)
    rng = np.random.default_rng(settings.seed + 2)  # timesteps, noise and placeholders

    def loss_of(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = program.prepare([list(train[i].tokens) for i in indices])
        inputs = {k: torch.from_numpy(v).to(torch_device) for k, v in batch.encoder_inputs.items()}
        return diffusion_loss(network, inputs, [train[i].entities for i in indices], sampler, rng)

    def dev_score() -> dict[str, Any]:
        """Dev P/R/F1 at the threshold tuned on dev: a fixed φ would judge early epochs, whose
        probabilities are less sharp, by the wrong cut (the graphs run once per epoch)."""
        best, _, table = tune_spec(program, SPEC, dev, settings.eval_batch_size)
        program.config = replace(program.config, decode=best)
        return {**max(table, key=lambda row: row["f1"])}

    fitted = fit(network, program.predict, loss_of, train, dev, record, out, dev_score)
    trained = Trained(SPEC, network, program, record, fitted)
    return tune_and_finish(trained, dev, data_dir, settings.eval_batch_size, torch_device, out)
