"""Train SetGNER with the shared loop (ner.training.loop), then tune the head threshold on dev.

The paper's inverse generation training (a second, tail-to-head decoder trained alternately and
discarded at inference) is left out: it doubles the decoder's training cost, which on two CPU
cores goes to more epochs of the forward model instead."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from nerserve.ner.archs.pointer.targets import IGNORE
from nerserve.ner.archs.setgen import SPEC
from nerserve.ner.archs.setgen.config import SetgenConfig, SetgenOptions
from nerserve.ner.archs.setgen.loss import setgen_loss
from nerserve.ner.archs.setgen.program import SetgenProgram
from nerserve.ner.archs.setgen.targets import batch_targets
from nerserve.ner.data import label_set
from nerserve.ner.decoding.overlap import Overlap
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.model_store import Manifest
from nerserve.ner.training.loop import ModelRecord, Trained, TrainSettings, fit, is_flat, start_run, tune_and_finish, warm_start


def train_setgen(
    data_dir: Path, out: Path, settings: TrainSettings, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    run = start_run(data_dir, settings, backbone_spec, device)
    torch_device, train, dev, backbone, lora = run.device, run.train, run.dev, run.backbone, run.lora
    flat = is_flat(train)
    overlap: Overlap = "flat" if flat else "any"
    # the paper decodes CoNLL-2003 greedily (1 beam) and the others with 4
    config = SetgenConfig(labels=tuple(label_set(train)), decode=SetgenOptions(overlap=overlap, beams=1 if flat else 4))
    network = build_network(SPEC, config, backbone, lora).to(torch_device)
    initialised = warm_start(network, settings.init_from, backbone, SPEC.name) if settings.init_from else {}
    program: SetgenProgram = eager_program(SPEC, network, backbone, torch_device)
    extra = {"warm_start": initialised, "inverse_generation": False} if initialised else {"inverse_generation": False}
    record = ModelRecord(out.name, SPEC.name, config.to_dict(), backbone, lora, data_dir, settings, extra, run.words)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(
        f"setgen: {len(train)} train / {len(dev)} dev sentences, labels {list(config.labels)}, overlap {overlap}, "
        f"{trainable:,} trainable parameters, device {torch_device}",
        flush=True,
    )
    rng = random.Random(settings.seed + 1)  # negatives

    def loss_of(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = program.prepare([list(train[i].tokens) for i in indices])
        inputs = {k: torch.from_numpy(v).to(torch_device) for k, v in batch.encoder_inputs.items()}
        targets = batch_targets([train[i].entities for i in indices], batch.lengths, config, rng, IGNORE)
        return setgen_loss(network, inputs, targets)

    fitted = fit(network, program.predict, loss_of, train, dev, record, out)
    trained = Trained(SPEC, network, program, record, fitted)
    return tune_and_finish(trained, dev, data_dir, settings.eval_batch_size, torch_device, out)
