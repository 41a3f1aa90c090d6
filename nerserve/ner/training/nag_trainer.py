"""Train NAG-NER with the shared loop (ner.training.loop), then choose τ_s on dev."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from nerserve.ner.archs.nag import SPEC
from nerserve.ner.archs.nag.config import NagConfig, NagDecodeOptions
from nerserve.ner.archs.nag.loss import nag_loss
from nerserve.ner.archs.nag.program import NagProgram
from nerserve.ner.archs.nag.targets import batch_targets, coverage
from nerserve.ner.data import Sentence, label_set
from nerserve.ner.decoding.overlap import Overlap
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.model_store import Manifest
from nerserve.ner.training.loop import ModelRecord, Trained, TrainSettings, fit, is_flat, start_run, tune_and_finish, warm_start

L_MAX_COVERAGE = 0.99  # the paper's l_max = 8 sub-words, raised until 99 % of entities fit


def l_max_coverage(program: NagProgram, sentences: list[Sentence], l_max: int) -> dict[str, float]:
    """How many training entities fit in l_max sub-words."""
    pieces = []
    for k in range(0, len(sentences), 256):
        pieces += program.subwords.encode([list(s.tokens) for s in sentences[k : k + 256]]).pieces
    return coverage([s.entities for s in sentences], pieces, l_max)


def train_nag(
    data_dir: Path, out: Path, settings: TrainSettings, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    run = start_run(data_dir, settings, backbone_spec, device)
    torch_device, train, dev, backbone, lora = run.device, run.train, run.dev, run.backbone, run.lora
    overlap: Overlap = "flat" if is_flat(train) else "any"
    config = NagConfig(labels=tuple(label_set(train)), decode=NagDecodeOptions(overlap=overlap))
    network = build_network(SPEC, config, backbone, lora).to(torch_device)
    program: NagProgram = eager_program(SPEC, network, backbone, torch_device)
    covered = l_max_coverage(program, train, config.l_max)
    at_paper_l_max = covered
    while covered["covered"] < L_MAX_COVERAGE and config.l_max < covered["longest"]:
        config = replace(config, l_max=config.l_max + 1)
        covered = l_max_coverage(program, train, config.l_max)
    if config.l_max != network.config.l_max:  # the decoder's slot count depends on l_max
        network = build_network(SPEC, config, backbone, lora).to(torch_device)
        program = eager_program(SPEC, network, backbone, torch_device)
    covered = {**covered, "l_max": config.l_max, "covered_at_l_max_8": at_paper_l_max["covered"]}
    extra: dict[str, Any] = {"l_max_coverage": covered}
    if settings.init_from:
        extra["warm_start"] = warm_start(network, settings.init_from, backbone, SPEC.name)
    record = ModelRecord(out.name, SPEC.name, config.to_dict(), backbone, lora, data_dir, settings, extra, run.words)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(
        f"nag: {len(train)} train / {len(dev)} dev sentences, labels {list(config.labels)}, overlap {overlap}, "
        f"l_max {config.l_max} covers {covered['covered']:.4f} of {covered['entities']} entities "
        f"(longest {covered['longest']} sub-words), {trainable:,} trainable parameters, device {torch_device}",
        flush=True,
    )
    rng = random.Random(settings.seed + 1)  # negatives

    def loss_of(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = program.prepare([list(train[i].tokens) for i in indices])
        inputs = {k: torch.from_numpy(v).to(torch_device) for k, v in batch.encoder_inputs.items()}
        targets = batch_targets([train[i].entities for i in indices], batch.pieces, config, rng)
        return nag_loss(network, inputs, targets)

    fitted = fit(network, program.predict, loss_of, train, dev, record, out)
    trained = Trained(SPEC, network, program, record, fitted)
    return tune_and_finish(trained, dev, data_dir, settings.eval_batch_size, torch_device, out)
