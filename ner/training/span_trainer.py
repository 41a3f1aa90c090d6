"""Train the span architecture: LoRA on the backbone + full heads, AdamW with linear warm-up/decay,
model selection on dev F1, resumable checkpoints, fixed seed, progress bar."""

from __future__ import annotations

import datetime
import platform
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import get_linear_schedule_with_warmup

from ner.archs.span.config import DecodeOptions, Overlap, SpanConfig
from ner.archs.span.loss import span_loss
from ner.archs.span.program import SpanBatch, SpanProgram
from ner.backbone import BackboneInfo, resolve_backbone
from ner.data import Sentence, label_set, read_split
from ner.loading import build_span_network, device_name, eager_program
from ner.lora import LoraSettings, save_weights, trainable_state
from ner.model_store import WEIGHTS, BackboneRecord, Manifest, write_manifest
from ner.runner import score
from ner.training.decode_tuning import THRESHOLDS, tune_decoding

DEV_SLICE = 300  # sentences of dev the regression test re-scores (tests/test_regression.py)


@dataclass
class TrainSettings:
    epochs: int = 6
    batch_size: int = 16
    lr_lora: float = 5e-4
    lr_heads: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.1
    seed: int = 47
    max_width: int | None = None  # default: covers 99.5 % of training entities
    train_limit: int | None = None
    dev_limit: int | None = None
    eval_batch_size: int = 64
    time_budget_minutes: float | None = None  # stop after the epoch that crosses it
    lora_rank: int = 16


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def coverage_width(sentences: list[Sentence], coverage: float = 0.995) -> int:
    lengths = Counter(e.end - e.start for s in sentences for e in s.entities if not e.is_discontinuous)
    total, running = sum(lengths.values()), 0
    for width in sorted(lengths):
        running += lengths[width]
        if running >= coverage * total:
            return width
    return 1


def is_nested(sentences: list[Sentence]) -> bool:
    return any(a.overlaps(b) for s in sentences for a in s.entities for b in s.entities if a != b)


def shuffled_batches(sentences: list[Sentence], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Random batches of similar length: shuffle, sort within chunks of 50 batches, shuffle batches."""
    order = list(range(len(sentences)))
    rng.shuffle(order)
    chunk = batch_size * 50
    batches: list[list[int]] = []
    for i in range(0, len(order), chunk):
        part = sorted(order[i : i + chunk], key=lambda j: len(sentences[j].tokens))
        batches += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def to_tensors(batch: SpanBatch, device: str) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    inputs = {k: torch.from_numpy(v).to(device) for k, v in batch.encoder_inputs.items()}
    return inputs, torch.from_numpy(batch.seeds).to(device), torch.from_numpy(batch.seed_mask).to(device)


def tune_threshold(program: SpanProgram, sentences: list[Sentence], batch_size: int) -> tuple[float, float]:
    """δ with the best dev F1 (the other decoding options as configured)."""
    best, f1, _ = tune_decoding(program, sentences, batch_size, {"threshold": THRESHOLDS})
    return best.threshold, f1


def _manifest(
    name: str,
    config: SpanConfig,
    backbone: BackboneInfo,
    lora: LoraSettings,
    data_dir: Path,
    settings: TrainSettings,
    training: dict[str, Any],
    scores: dict[str, Any],
) -> Manifest:
    return Manifest(
        name=name,
        architecture="span",
        version=datetime.date.today().isoformat() + ".1",
        labels=list(config.labels),
        backbone=BackboneRecord(name=backbone.name, package=backbone.package, version=backbone.version, sha256=backbone.sha256),
        config=config.to_dict(),
        lora=lora.to_dict(),
        data={"folder": data_dir.name, "train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"},
        training={**asdict(settings), **training},
        scores=scores,
    )


def train_span(
    data_dir: Path, out: Path, settings: TrainSettings, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    seed_everything(settings.seed)
    torch_device = device_name(device)
    train = read_split(data_dir, "train", settings.train_limit)
    dev = read_split(data_dir, "dev", settings.dev_limit)
    labels = tuple(label_set(train))
    overlap: Overlap = "nested" if is_nested(train) else "flat"
    config = SpanConfig(
        labels=labels,
        max_width=settings.max_width or coverage_width(train),
        decode=DecodeOptions(overlap=overlap),
    )
    backbone = resolve_backbone(backbone_spec)
    lora = LoraSettings(rank=settings.lora_rank, alpha=2 * settings.lora_rank)
    network = build_span_network(config, backbone, lora).to(torch_device)
    program = eager_program(network, backbone, torch_device)

    lora_params = [p for n, p in network.named_parameters() if p.requires_grad and "lora_" in n]
    head_params = [p for n, p in network.named_parameters() if p.requires_grad and "lora_" not in n]
    optimizer = torch.optim.AdamW(
        [{"params": lora_params, "lr": settings.lr_lora}, {"params": head_params, "lr": settings.lr_heads}],
        weight_decay=settings.weight_decay,
    )
    steps_per_epoch = (len(train) + settings.batch_size - 1) // settings.batch_size
    total_steps = steps_per_epoch * settings.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(settings.warmup * total_steps), total_steps)

    checkpoint = out / "checkpoint" / "last.pt"
    start_epoch, best_f1, history, elapsed = 0, -1.0, [], 0.0
    best_state: dict[str, torch.Tensor] | None = None
    if checkpoint.is_file():
        saved = torch.load(checkpoint, map_location=torch_device, weights_only=True)
        network.load_state_dict(saved["model"], strict=False)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        start_epoch, best_f1, elapsed = int(saved["epoch"]), float(saved["best_f1"]), float(saved["elapsed"])
        history = list(saved["history"])
        best_state = saved["best_state"]
        print(f"resumed from {checkpoint} after epoch {start_epoch} (best dev F1 {best_f1:.4f})")

    rng = random.Random(settings.seed)
    for _ in range(start_epoch):  # same batch order as an uninterrupted run
        shuffled_batches(train, settings.batch_size, rng)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(
        f"span: {len(train)} train / {len(dev)} dev sentences, labels {list(labels)}, max_width {config.max_width}, "
        f"overlap {overlap}, {trainable:,} trainable parameters, device {torch_device}"
    )

    for epoch in range(start_epoch, settings.epochs):
        started = time.perf_counter()
        network.train()
        bar = tqdm(shuffled_batches(train, settings.batch_size, rng), desc=f"epoch {epoch + 1}/{settings.epochs}", unit="batch")
        running = 0.0
        for step, indices in enumerate(bar, start=1):
            batch = program.prepare([list(train[i].tokens) for i in indices])
            inputs, seeds, seed_mask = to_tensors(batch, torch_device)
            loss, parts = span_loss(network, inputs, seeds, seed_mask, [train[i].entities for i in indices])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            running = 0.98 * running + 0.02 * float(loss) if step > 1 else float(loss)
            if step % 20 == 0:
                bar.set_postfix(loss=f"{running:.3f}", **{k: f"{v:.3f}" for k, v in parts.items()})
        network.eval()
        report = score(program.predict, dev, settings.eval_batch_size)
        elapsed += time.perf_counter() - started
        history.append({"epoch": epoch + 1, "dev_f1": report["f1"], "loss": running, "minutes": elapsed / 60})
        print(
            f"epoch {epoch + 1}: loss {running:.4f}, dev P/R/F1 {report['precision']:.4f}/{report['recall']:.4f}/"
            f"{report['f1']:.4f}, {elapsed / 60:.1f} min so far",
            flush=True,
        )
        if report["f1"] > best_f1:
            best_f1 = float(report["f1"])
            best_state = {k: v.detach().clone() for k, v in trainable_state(network).items()}
            save_weights(network, out / WEIGHTS)
            write_manifest(
                out,
                _manifest(
                    out.name,
                    config,
                    backbone,
                    lora,
                    data_dir,
                    settings,
                    {"history": history, "status": "in progress"},
                    {"dev": {"f1": best_f1}},
                ),
            )
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "model": trainable_state(network),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "epoch": epoch + 1,
                "best_f1": best_f1,
                "elapsed": elapsed,
                "history": history,
                "best_state": best_state,
            },
            checkpoint,
        )
        if settings.time_budget_minutes and elapsed / 60 > settings.time_budget_minutes:
            print(f"time budget of {settings.time_budget_minutes} min reached after epoch {epoch + 1}")
            break

    assert best_state is not None
    network.load_state_dict(best_state, strict=False)
    network.eval()
    threshold, tuned_f1 = tune_threshold(program, dev, settings.eval_batch_size)
    config = SpanConfig.from_dict({**config.to_dict(), "decode": asdict(config.decode.replace(threshold=threshold))})
    network.config = config
    program.config = config
    print(f"dev-tuned threshold δ={threshold}: dev F1 {tuned_f1:.4f}")
    dev_report = score(program.predict, dev, settings.eval_batch_size)
    test_report = score(program.predict, read_split(data_dir, "test"), settings.eval_batch_size, progress=True)
    print(f"test P/R/F1 {test_report['precision']:.4f}/{test_report['recall']:.4f}/{test_report['f1']:.4f}")
    keep = ("precision", "recall", "f1", "sentences", "sentences_per_second")
    slice_report = score(program.predict, dev[:DEV_SLICE], settings.eval_batch_size)
    scores = {
        "dev": {k: dev_report[k] for k in keep},
        "dev_slice": {k: slice_report[k] for k in ("f1", "sentences")},
        "test": {k: test_report[k] for k in keep} | {"nested": test_report["nested"]},
        "measured_on": f"{platform.machine()}, {torch.get_num_threads()} threads, {torch_device}",
    }
    training = {
        "history": history,
        "minutes": elapsed / 60,
        "status": "done",
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads",
        "torch": torch.__version__,
    }
    save_weights(network, out / WEIGHTS)
    manifest = _manifest(out.name, config, backbone, lora, data_dir, settings, training, scores)
    write_manifest(out, manifest)
    return manifest
