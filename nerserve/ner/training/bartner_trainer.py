"""Train the BARTNER-style reference with the shared loop (ner.training.loop), then tune the
entity-score threshold on dev."""

from __future__ import annotations

from pathlib import Path

import torch

from nerserve.ner.archs.bartner import SPEC
from nerserve.ner.archs.bartner.config import BartnerConfig, BartnerOptions
from nerserve.ner.archs.bartner.loss import bartner_loss
from nerserve.ner.archs.bartner.program import BartnerProgram
from nerserve.ner.data import label_set
from nerserve.ner.decoding.overlap import Overlap
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.model_store import Manifest
from nerserve.ner.training.loop import ModelRecord, Trained, TrainSettings, fit, is_flat, start_run, tune_and_finish, warm_start


def train_bartner(
    data_dir: Path, out: Path, settings: TrainSettings, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    run = start_run(data_dir, settings, backbone_spec, device)
    torch_device, train, dev, backbone, lora = run.device, run.train, run.dev, run.backbone, run.lora
    flat = is_flat(train)
    overlap: Overlap = "flat" if flat else "any"
    # the paper: greedy for CoNLL-2003 and GENIA, 4 beams for the discontinuous sets
    discontinuous = any(e.is_discontinuous for s in train for e in s.entities)
    options = BartnerOptions(overlap=overlap, beams=4 if discontinuous else 1)
    config = BartnerConfig(labels=tuple(label_set(train)), decode=options)
    network = build_network(SPEC, config, backbone, lora).to(torch_device)
    initialised = warm_start(network, settings.init_from, backbone, SPEC.name) if settings.init_from else {}
    program: BartnerProgram = eager_program(SPEC, network, backbone, torch_device)
    extra = {"warm_start": initialised} if initialised else {}
    record = ModelRecord(out.name, SPEC.name, config.to_dict(), backbone, lora, data_dir, settings, extra, run.words)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(
        f"bartner: {len(train)} train / {len(dev)} dev sentences, labels {list(config.labels)}, overlap {overlap}, "
        f"beams {options.beams}, {trainable:,} trainable parameters, device {torch_device}",
        flush=True,
    )

    def loss_of(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = program.prepare([list(train[i].tokens) for i in indices])
        inputs = {k: torch.from_numpy(v).to(torch_device) for k, v in batch.encoder_inputs.items()}
        return bartner_loss(network, inputs, [train[i].entities for i in indices])

    fitted = fit(network, program.predict, loss_of, train, dev, record, out)
    trained = Trained(SPEC, network, program, record, fitted)
    return tune_and_finish(trained, dev, data_dir, settings.eval_batch_size, torch_device, out)
