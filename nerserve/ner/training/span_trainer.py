"""Train the span architecture (Locate and Label) with the shared loop (ner.training.loop)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from nerserve.ner.archs.span import SPEC, THRESHOLDS
from nerserve.ner.archs.span.config import DecodeOptions, SpanConfig
from nerserve.ner.archs.span.loss import span_loss
from nerserve.ner.archs.span.program import SpanBatch, SpanProgram
from nerserve.ner.data import Sentence, label_set, read_split
from nerserve.ner.decoding.overlap import Overlap
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.model_store import Manifest
from nerserve.ner.training.decode_tuning import tune_decoding
from nerserve.ner.training.loop import ModelRecord, TrainSettings, final_scores, finish, fit, is_nested, start_run, warm_start


def coverage_width(sentences: list[Sentence], coverage: float = 0.995) -> int:
    lengths = Counter(e.end - e.start for s in sentences for e in s.entities if not e.is_discontinuous)
    total, running = sum(lengths.values()), 0
    for width in sorted(lengths):
        running += lengths[width]
        if running >= coverage * total:
            return width
    return 1


def to_tensors(batch: SpanBatch, device: str) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    inputs = {k: torch.from_numpy(v).to(device) for k, v in batch.encoder_inputs.items()}
    return inputs, torch.from_numpy(batch.seeds).to(device), torch.from_numpy(batch.seed_mask).to(device)


def tune_threshold(program: SpanProgram, sentences: list[Sentence], batch_size: int) -> tuple[float, float]:
    """δ with the best dev F1 (the other decoding options as configured)."""
    best, f1, _ = tune_decoding(program, sentences, batch_size, {"threshold": THRESHOLDS})
    return best.threshold, f1


def train_span(
    data_dir: Path, out: Path, settings: TrainSettings, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    run = start_run(data_dir, settings, backbone_spec, device)
    torch_device, train, dev, backbone, lora = run.device, run.train, run.dev, run.backbone, run.lora
    labels = tuple(label_set(train))
    overlap: Overlap = "nested" if is_nested(train) else "flat"
    config = SpanConfig(
        labels=labels,
        max_width=settings.max_width or coverage_width(train),
        decode=DecodeOptions(overlap=overlap),
    )
    network = build_network(SPEC, config, backbone, lora).to(torch_device)
    initialised = warm_start(network, settings.init_from, backbone, SPEC.name) if settings.init_from else {}
    program: SpanProgram = eager_program(SPEC, network, backbone, torch_device)
    extra = {"warm_start": initialised} if initialised else {}
    record = ModelRecord(out.name, SPEC.name, config.to_dict(), backbone, lora, data_dir, settings, extra, run.words)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(
        f"span: {len(train)} train / {len(dev)} dev sentences, labels {list(labels)}, max_width {config.max_width}, "
        f"overlap {overlap}, {trainable:,} trainable parameters, device {torch_device}"
    )

    def loss_of(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = program.prepare([list(train[i].tokens) for i in indices])
        inputs, seeds, seed_mask = to_tensors(batch, torch_device)
        return span_loss(network, inputs, seeds, seed_mask, [train[i].entities for i in indices])

    fitted = fit(network, program.predict, loss_of, train, dev, record, out)
    threshold, tuned_f1 = tune_threshold(program, dev, settings.eval_batch_size)
    config = replace(config, decode=replace(config.decode, threshold=threshold))
    network.config = config
    program.config = config
    record.config = config.to_dict()
    print(f"dev-tuned threshold δ={threshold}: dev F1 {tuned_f1:.4f}")
    scores = final_scores(program.predict, dev, read_split(data_dir, "test"), settings.eval_batch_size, torch_device)
    return finish(network, record, fitted, scores, out)
