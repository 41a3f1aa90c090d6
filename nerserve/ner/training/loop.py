"""The training loop every architecture shares: LoRA on the backbone + full heads, AdamW with linear
warm-up/decay, model selection on dev F1, resumable checkpoints, fixed seed, progress bar, and the
final scoring (dev, regression slice, test) stored in the manifest."""

from __future__ import annotations

import dataclasses
import platform
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from nerserve.ner.backbone import BackboneInfo, resolve_backbone
from nerserve.ner.data import Sentence, read_split
from nerserve.ner.loading import device_name
from nerserve.ner.lora import LoraSettings, save_weights, trainable_state
from nerserve.ner.model_store import WEIGHTS, BackboneRecord, Manifest, weights_version, write_manifest
from nerserve.ner.runner import score
from nerserve.ner.text.segment import PLAIN_WORDS, WordStyle

DEV_SLICE = 300  # sentences of dev the regression test re-scores (tests/test_regression.py)
LossFunction = Callable[[list[int]], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class TrainSettings:
    epochs: int = 6
    batch_size: int = 16
    lr_lora: float = 5e-4
    lr_heads: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.1
    seed: int = 47
    max_width: int | None = None  # span: default covers 99.5 % of training entities
    train_limit: int | None = None
    dev_limit: int | None = None
    eval_batch_size: int = 64
    # minutes of training epochs: after the first epoch the epoch count (and with it the learning-rate
    # decay) is fitted to it, and training stops after an epoch that crosses it anyway
    time_budget_minutes: float | None = None
    # "bf16": autocast of the training steps (checked on CPU; the GPU runs so far were fp32, docs/gpu.md)
    precision: str = "fp32"
    lora_rank: int = 16
    init_from: Path | None = None  # the folder of a trained model that starts this one: its encoder, or all of it
    scored_share: float = 0.4  # gner: share of each epoch's open-label mixture drawn from the scored set
    held_out: str | None = None  # gliner: comma-separated sets of the data root left out of training
    renamed_share: float = 0.3  # gliner: chance that an asked name is swapped for a synonym or paraphrase
    wordnet_share: float = 0.0  # gliner: chance that it is swapped for a WordNet sub-type of its mentions
    common_noun_share: float = 0.0  # gliner: chance that an example asks for WordNet kinds of its common nouns
    lowercase_share: float = 0.0  # gliner: chance that an example's words are all lowercased (typed queries, tweets)
    focal_gamma: float = 0.0  # gliner: focal loss's gamma (0: plain binary cross-entropy)
    focal_alpha: float | None = None  # gliner: a positive pair's weight, a negative's 1 - alpha (None: both 1)


@dataclass
class ModelRecord:
    """What a manifest says about a trained model, besides its scores."""

    name: str
    architecture: str
    config: dict[str, Any]
    backbone: BackboneInfo
    lora: LoraSettings
    data_dir: Path
    settings: TrainSettings
    extra: dict[str, Any] = field(default_factory=dict)  # architecture-specific training facts
    words: WordStyle = PLAIN_WORDS  # how its training data writes words (RunStart.words)

    def manifest(self, training: dict[str, Any], scores: dict[str, Any], weights: Path) -> Manifest:
        """The manifest of the weights just written to `weights` (versioned by day and digest)."""
        backbone = self.backbone
        return Manifest(
            name=self.name,
            architecture=self.architecture,
            version=weights_version(weights),
            labels=list(self.config["labels"]),
            backbone=BackboneRecord(
                name=backbone.name, package=backbone.package, version=backbone.version, sha256=backbone.sha256
            ),
            config=self.config,
            lora=self.lora.to_dict(),
            data={"folder": self.data_dir.name, "train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"},
            training={**asdict(self.settings), **self.extra, **training},
            scores=scores,
            words=self.words,
        )


@dataclass
class RunStart:
    device: str
    train: list[Sentence]
    dev: list[Sentence]
    backbone: BackboneInfo
    lora: LoraSettings
    words: WordStyle  # how the train split writes words, for the manifest (the service cuts texts so)


def start_run(data_dir: Path, settings: TrainSettings, backbone_spec: str | None, device: str | None) -> RunStart:
    """Seed, device, the train/dev splits, the backbone and the LoRA settings of a training run."""
    seed_everything(settings.seed)
    train = read_split(data_dir, "train", settings.train_limit)
    return RunStart(
        device_name(device),
        train,
        read_split(data_dir, "dev", settings.dev_limit),
        resolve_backbone(backbone_spec),
        LoraSettings(rank=settings.lora_rank, alpha=2 * settings.lora_rank),
        WordStyle.written_in(sentence.tokens for sentence in train),
    )


def warm_start(network: nn.Module, folder: Path, backbone: BackboneInfo, architecture: str) -> dict[str, Any]:
    """Start `network` from a trained model: its shared word encoder (LoRA adapters, char CNN, shape
    embedding, BiLSTM) whatever the architecture, since every architecture's encoder has the same
    parameter names; and, when the source is of the same architecture, every other tensor whose
    shape still fits too (heads, decoder), which resumes a committed model whose optimizer
    checkpoint is gone."""
    from safetensors.torch import load_file

    from nerserve.ner.model_store import read_manifest

    source = read_manifest(folder)
    if source.backbone.sha256 != backbone.sha256:
        raise ValueError(f"{folder}: trained on another backbone, its encoder cannot start this model")
    saved = load_file(str(folder / WEIGHTS))
    params = dict(network.named_parameters())
    fits = {n: t for n, t in saved.items() if n in params and params[n].shape == t.shape}
    encoder = {n for n in fits if n.startswith("encoder.")}
    encoder_params = sum(1 for n, p in params.items() if n.startswith("encoder.") and p.requires_grad)
    if len(encoder) != encoder_params:
        raise ValueError(f"{folder}: only {len(encoder)} of {encoder_params} encoder tensors fit this model")
    same_architecture = source.architecture == architecture
    chosen = set(fits) if same_architecture else encoder
    with torch.no_grad():
        for name in chosen:
            params[name].copy_(fits[name].to(params[name].dtype))
    others = len(chosen) - len(encoder)
    print(f"initialised from {folder.name}: {len(encoder)} encoder + {others} other tensors", flush=True)
    started = {"model": folder.name, "version": source.version, "tensors": len(encoder), "other_tensors": others}
    if same_architecture:  # the learning curve goes on from the source's (docs/learning-curves.md)
        started["earlier_runs"] = earlier_runs(source.training)
    return started


def earlier_runs(training: dict[str, Any]) -> list[dict[str, Any]]:
    """A model's training runs (from its manifest's `training`), oldest first: those it was
    warm-started from, then its own."""
    previous = training.get("warm_start", {}).get("earlier_runs", [])
    own = {k: training.get(k) for k in ("history", "device", "machine", "minutes")}
    return [*previous, own]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def is_flat(sentences: list[Sentence]) -> bool:
    """No nested and no discontinuous entity in the data (its overlap rule is then "flat")."""
    return not is_nested(sentences) and not any(e.is_discontinuous for s in sentences for e in s.entities)


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


class WarmupLinearDecay:
    """Learning-rate factor: linear warm-up, then linear decay to 0 at `total_steps`. A callable
    object rather than a closure so that LambdaLR checkpoints it, and so that `total_steps` can be
    refitted to a time budget once an epoch's cost is known."""

    def __init__(self, warmup_steps: int, total_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


def epochs_within_budget(settings: TrainSettings, epochs_done: int, minutes: float) -> int:
    """How many epochs fit the time budget at the pace measured so far (at least the ones done)."""
    if not settings.time_budget_minutes or epochs_done == 0:
        return settings.epochs
    per_epoch = minutes / epochs_done
    return max(epochs_done, min(settings.epochs, int(settings.time_budget_minutes / per_epoch)))


def autocast_of(settings: TrainSettings, device_type: str) -> torch.autocast:
    """bf16 autocast for the training steps (eval stays fp32: it selects the model that is served in fp32)."""
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=settings.precision == "bf16")


@dataclass
class FitResult:
    best_state: dict[str, torch.Tensor]
    history: list[dict[str, Any]]
    minutes: float


def fit(
    network: nn.Module,
    predict: Callable[[list[list[str]]], Any],
    loss_of: LossFunction,
    train: list[Sentence],
    dev: list[Sentence],
    record: ModelRecord,
    out: Path,
    dev_score: Callable[[], dict[str, Any]] | None = None,
    before_epoch: Callable[[int], None] | None = None,
) -> FitResult:
    """Epochs of `loss_of(batch indices)` steps, dev F1 after each (`dev_score()` instead of scoring
    `predict` when given, e.g. F1 at the threshold tuned on dev); the best weights are written to
    OUT as they appear and every epoch is checkpointed to OUT/checkpoint/last.pt (resumed from).
    `before_epoch(epoch)` may replace `train`'s sentences in place (same count) before each epoch."""
    settings = record.settings
    lora_params = [p for n, p in network.named_parameters() if p.requires_grad and "lora_" in n]
    head_params = [p for n, p in network.named_parameters() if p.requires_grad and "lora_" not in n]
    optimizer = torch.optim.AdamW(
        [{"params": lora_params, "lr": settings.lr_lora}, {"params": head_params, "lr": settings.lr_heads}],
        weight_decay=settings.weight_decay,
    )
    steps_per_epoch = (len(train) + settings.batch_size - 1) // settings.batch_size
    total_steps = steps_per_epoch * settings.epochs
    schedule = WarmupLinearDecay(int(settings.warmup * total_steps), total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    device_type = next(network.parameters()).device.type

    checkpoint = out / "checkpoint" / "last.pt"
    start_epoch, best_f1, history, elapsed = 0, -1.0, [], 0.0
    best_state: dict[str, torch.Tensor] | None = None
    if checkpoint.is_file():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
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
    epochs = epochs_within_budget(settings, start_epoch, elapsed / 60)
    schedule.total_steps = steps_per_epoch * epochs
    epoch = start_epoch
    while epoch < epochs:
        started = time.perf_counter()
        if before_epoch:
            before_epoch(epoch)
        network.train()
        bar = tqdm(shuffled_batches(train, settings.batch_size, rng), desc=f"epoch {epoch + 1}/{epochs}", unit="batch")
        running = 0.0
        for step, indices in enumerate(bar, start=1):
            with autocast_of(settings, device_type):
                loss, parts = loss_of(indices)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            value = float(loss.detach())
            running = 0.98 * running + 0.02 * value if step > 1 else value
            if step % 20 == 0:
                bar.set_postfix(loss=f"{running:.3f}", **{k: f"{v:.3f}" for k, v in parts.items()})
        network.eval()
        report = dev_score() if dev_score else score(predict, dev, settings.eval_batch_size)
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
            progress = {"history": history, "status": "in progress"}
            write_manifest(out, record.manifest(progress, {"dev": {"f1": best_f1}}, out / WEIGHTS))
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
        epoch += 1
        if settings.time_budget_minutes and elapsed / 60 > settings.time_budget_minutes:
            print(f"time budget of {settings.time_budget_minutes} min reached after epoch {epoch}")
            break
        if settings.time_budget_minutes and epoch == start_epoch + 1:  # once: a moving decay would jump
            epochs = epochs_within_budget(settings, epoch, elapsed / 60)
            schedule.total_steps = steps_per_epoch * epochs
            print(f"{epochs} epochs fit the time budget of {settings.time_budget_minutes} min", flush=True)
    if best_state is None:
        raise RuntimeError("no epoch was trained")
    network.load_state_dict(best_state, strict=False)
    network.eval()
    return FitResult(best_state, history, elapsed / 60)


def final_scores(
    predict: Callable[[list[list[str]]], Any], dev: list[Sentence], test: list[Sentence], batch_size: int, device: str
) -> dict[str, Any]:
    """Dev, the regression slice and test (with the nested and discontinuous breakdowns)."""
    dev_report = score(predict, dev, batch_size)
    test_report = score(predict, test, batch_size, progress=True)
    print(f"test P/R/F1 {test_report['precision']:.4f}/{test_report['recall']:.4f}/{test_report['f1']:.4f}")
    keep = ("precision", "recall", "f1", "sentences", "sentences_per_second")
    slice_report = score(predict, dev[:DEV_SLICE], batch_size)
    breakdowns = {k: test_report[k] for k in ("nested", "discontinuous")}
    return {
        "dev": {k: dev_report[k] for k in keep},
        "dev_slice": {k: slice_report[k] for k in ("f1", "sentences")},
        "test": {k: test_report[k] for k in keep} | breakdowns,
        "measured_on": f"{platform.machine()}, {torch.get_num_threads()} threads, {device}",
    }


def device_description(device: torch.device) -> str:
    return f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type


def finish(network: nn.Module, record: ModelRecord, fitted: FitResult, scores: dict[str, Any], out: Path) -> Manifest:
    training = {
        "history": fitted.history,
        "minutes": fitted.minutes,
        "status": "done",
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads",
        "device": device_description(next(network.parameters()).device),
        "torch": torch.__version__,
    }
    save_weights(network, out / WEIGHTS)
    manifest = record.manifest(training, scores, out / WEIGHTS)
    write_manifest(out, manifest)
    return manifest


@dataclass
class Trained:
    """What a trainer hands to `tune_and_finish`: the fitted network, its eager program and record."""

    spec: Any  # ner.archs.base.ArchitectureSpec
    network: nn.Module
    program: Any  # ner.archs.base.ProgramBase over the network's own graphs
    record: ModelRecord
    fitted: FitResult


def tune_and_finish(trained: Trained, dev: list[Sentence], data_dir: Path, batch_size: int, device: str, out: Path) -> Manifest:
    """Choose the decoding options on dev (the architecture's grid), score dev, the regression
    slice and test with them (how generated sequences ended included), and write the model."""
    from nerserve.ner.training.decode_tuning import tune_spec

    program = trained.program
    best, tuned_f1, _ = tune_spec(program, trained.spec, dev, batch_size)
    config = dataclasses.replace(program.config, decode=best)
    trained.network.config = config  # type: ignore[assignment]
    program.config = config
    trained.record.config = config.to_dict()
    print(f"dev-tuned {asdict(best)}: dev F1 {tuned_f1:.4f}", flush=True)
    program.outcomes.clear()
    scores = final_scores(program.predict, dev, read_split(data_dir, "test"), batch_size, device)
    if program.outcomes:
        scores["decoder_outcomes"] = dict(program.outcomes)  # sequences that could not be mapped included
    return finish(trained.network, trained.record, trained.fitted, scores, out)
