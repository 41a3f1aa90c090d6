"""Train GNER on a mixture of many domains with natural-language labels (open-label training).

The scored set (`--data`, e.g. conll03) and every set of `open/` beside it join the mixture, except
the sets held out as unseen domains. Each epoch draws a fresh sample balanced across the sets, and
each example gets its own label list: the set's label names shuffled, some present types dropped
(their entities become O), some absent labels of other domains added, so that the model learns to
follow the list rather than the dataset. Model selection on the scored set's dev.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nerserve.ner.archs.gner import SPEC
from nerserve.ner.archs.gner.config import GnerConfig, GnerOptions
from nerserve.ner.archs.gner.loss import gner_loss
from nerserve.ner.archs.gner.network import LowRankLinear
from nerserve.ner.archs.gner.program import GnerProgram
from nerserve.ner.archs.gner.tagging import tags_of, target_ids
from nerserve.ner.data import Sentence, named_split
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.model_store import Manifest
from nerserve.ner.runner import score
from nerserve.ner.training.loop import FitResult, ModelRecord, final_scores, finish, fit, start_run
from nerserve.ner.types import Entity, EntitySet

HELD_OUT = ("harveyner", "broad_twitter_corpus")  # unseen domains: never trained on, scored at the end
BIOMEDICAL = frozenset({"anatem", "bc2gm", "bc5cdr", "ncbi", "genia", "cadec"})
MAX_WORDS = 40  # longer training sentences are left out (the target grows ~5 tokens a word)
DEV_SCORED = 1000  # final scoring: dev sentences (model selection used the first 400)
HELD_OUT_SCORED = 1000  # and sentences of each held-out test set


@dataclass(frozen=True)
class Source:
    name: str
    sentences: list[Sentence]  # entity types already the natural label names
    labels: tuple[str, ...]


def flat(sentences: list[Sentence]) -> list[Sentence]:
    """Nested and discontinuous entities left out (BIO tags are flat): outer, earlier ones kept."""
    out = []
    for sentence in sentences:
        kept: list[Entity] = []
        for entity in sorted(sentence.entities, key=lambda e: (e.start, -e.end)):
            if not entity.is_discontinuous and not any(entity.overlaps(k) for k in kept):
                kept.append(entity)
        out.append(Sentence(sentence.tokens, EntitySet(kept)))
    return out


def load_source(folder: Path, split: str, limit: int | None = None) -> Source:
    sentences, labels = named_split(folder, split, limit)
    return Source(folder.name, sentences, labels)


def training_sources(data_dir: Path, held_out: tuple[str, ...]) -> list[Source]:
    folders = [data_dir, *sorted(p for p in (data_dir.parent / "open").iterdir() if (p / "train.jsonl").is_file())]
    sources = []
    for folder in folders:
        if folder.name in held_out:
            continue
        source = load_source(folder, "train")
        usable = [s for s in flat(source.sentences) if 0 < len(s.tokens) <= MAX_WORDS]
        sources.append(Source(source.name, usable, source.labels))
    return sources


def sample_mixture(sources: list[Source], size: int, scored_share: float, rng: random.Random) -> list[tuple[Sentence, int]]:
    """`size` examples: `scored_share` of them from the first (scored) source, the rest evenly over the others."""
    scored = int(size * scored_share)
    shares = [scored] + [(size - scored) // (len(sources) - 1)] * (len(sources) - 1)
    picked = []
    for index, (source, share) in enumerate(zip(sources, shares, strict=True)):
        picked += [(s, index) for s in rng.sample(source.sentences, min(share, len(source.sentences)))]
    rng.shuffle(picked)
    return picked


def epoch_rng(seed: int, epoch: int) -> random.Random:
    """The mixture's generator for one epoch: the same sample again when a run is resumed."""
    return random.Random(f"{seed}:{epoch}")


def sample_labels(source: Source, sources: list[Source], rng: random.Random) -> tuple[str, ...]:
    """The source's labels shuffled; sometimes some dropped, sometimes labels of another domain added."""
    labels = list(source.labels)
    if len(labels) > 1 and rng.random() < 0.3:
        labels = [label for label in labels if rng.random() > 0.3] or [rng.choice(labels)]
    if rng.random() < 0.3:
        domain = source.name in BIOMEDICAL
        foreign = sorted({name for s in sources if (s.name in BIOMEDICAL) != domain for name in s.labels} - set(labels))
        labels += rng.sample(foreign, min(len(foreign), rng.randint(1, 3)))
    rng.shuffle(labels)
    return tuple(labels)


def train_gner(
    data_dir: Path, out: Path, settings: Any, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    run = start_run(data_dir, settings, backbone_spec, device)
    torch_device, backbone, lora = run.device, run.backbone, run.lora
    sources = training_sources(data_dir, HELD_OUT)
    scored = load_source(data_dir, "dev", settings.dev_limit or 400)
    size = settings.train_limit or 16000
    mixture = sample_mixture(sources, size, settings.scored_share, epoch_rng(settings.seed, 0))
    train = [sentence for sentence, _ in mixture]

    def resample(epoch: int) -> None:  # a fresh sample each epoch: 4× more distinct sentences in 4 epochs
        mixture[:] = sample_mixture(sources, size, settings.scored_share, epoch_rng(settings.seed, epoch))
        train[:] = [sentence for sentence, _ in mixture]

    from nerserve.ner.encoder import load_backbone

    shape = load_backbone(backbone).config
    config = GnerConfig(
        labels=scored.labels,
        decoder_layers=int(shape.num_hidden_layers),
        decoder_heads=int(shape.num_attention_heads),
        head_dim=int(shape.hidden_size) // int(shape.num_attention_heads),
        decode=GnerOptions(),
    )
    network = build_network(SPEC, config, backbone, lora).to(torch_device)
    extra: dict[str, Any] = {
        "sources": {s.name: {"sentences": len(s.sentences), "labels": list(s.labels)} for s in sources},
        "held_out": list(HELD_OUT),
        "mixture": len(train),
    }
    if settings.init_from:
        extra["warm_start"] = encoder_from(network, settings.init_from)
    program: GnerProgram = eager_program(SPEC, network, backbone, torch_device)
    record = ModelRecord(out.name, SPEC.name, config.to_dict(), backbone, lora, data_dir, settings, extra, run.words)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(
        f"gner: {len(sources)} sources, {len(train)} examples an epoch, {trainable:,} trainable parameters, "
        f"device {torch_device}",
        flush=True,
    )
    markers = program.markers
    label_rng = random.Random(settings.seed + 1)

    def loss_of(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        examples = [mixture[i] for i in indices]
        labels = [sample_labels(sources[source], sources, label_rng) for _, source in examples]
        batch = program.prepare([list(sentence.tokens) for sentence, _ in examples])
        inputs = {k: torch.from_numpy(v).to(torch_device) for k, v in program.encoder_inputs(batch, labels).items()}
        targets: list[list[int]] = []
        tag_tokens: set[int] = set()
        for (sentence, _), names, tokenized in zip(examples, labels, batch.sentences, strict=True):
            spans = [(e.type, e.start, e.end) for e in sentence.entities if e.type in names]
            tags = tags_of(len(sentence.tokens), spans)
            codec = program.codec(names)
            targets.append(target_ids(tokenized.pieces, tags, codec, markers))
            tag_tokens.update(token for sequence in codec.sequences for token in sequence)
        return gner_loss(network, inputs, targets, markers.start, tag_tokens), {}

    def predict(sentences: list[list[str]]) -> Any:
        return program.predict(sentences, GnerOptions(labels=scored.labels))

    fitted: FitResult = fit(network, predict, loss_of, train, scored.sentences, record, out, before_epoch=resample)
    return finish_gner(network, program, record, fitted, data_dir, settings, out)


def encoder_from(network: torch.nn.Module, folder: Path) -> dict[str, Any]:
    """Start from a trained model: every tensor of a gner model (continuing it, its earlier runs
    kept for the learning curve), or the encoder's LoRA adapters of any other architecture on the
    same backbone."""
    from safetensors.torch import load_file

    from nerserve.ner.model_store import WEIGHTS, read_manifest
    from nerserve.ner.training.loop import earlier_runs

    source = read_manifest(folder)
    same = source.architecture == SPEC.name
    saved = load_file(str(folder / WEIGHTS))
    params = dict(network.named_parameters())
    copied = 0
    with torch.no_grad():
        for name, tensor in saved.items():
            target = name if same else name.replace("encoder.backbone.", "backbone.", 1)
            if (same or name.startswith("encoder.backbone.")) and target in params and params[target].shape == tensor.shape:
                params[target].copy_(tensor.to(params[target].dtype))
                copied += 1
    print(f"initialised from {folder.name} ({source.architecture}): {copied} tensors", flush=True)
    started: dict[str, Any] = {"model": folder.name, "version": source.version, "tensors": copied}
    if same:
        started["earlier_runs"] = earlier_runs(source.training)
    return started


def finish_gner(
    network: torch.nn.Module,
    program: GnerProgram,
    record: ModelRecord,
    fitted: FitResult,
    data_dir: Path,
    settings: Any,
    out: Path,
) -> Manifest:
    """Scores on the scored set (dev, regression slice, test) and on each held-out set's test.
    Autoregressive decoding is slow on CPU: dev is scored on its first DEV_SCORED sentences and each
    held-out test on its first HELD_OUT_SCORED (the manifest says how many)."""
    for module in network.modules():  # the decoder's deltas added into its weights: 3× fewer products per step
        if isinstance(module, LowRankLinear):
            module.fold()
    scored_dev = load_source(data_dir, "dev", DEV_SCORED)
    scored_test = load_source(data_dir, "test")

    def asking(labels: tuple[str, ...]) -> Any:
        return lambda sentences: program.predict(sentences, GnerOptions(labels=labels))

    scores = final_scores(
        asking(scored_dev.labels), scored_dev.sentences, scored_test.sentences, settings.eval_batch_size, "cpu"
    )
    unseen = {}
    for name in HELD_OUT:
        source = load_source(data_dir.parent / "open" / name, "test", HELD_OUT_SCORED)
        report = score(asking(source.labels), source.sentences, settings.eval_batch_size)
        unseen[name] = {k: report[k] for k in ("precision", "recall", "f1", "sentences")}
        print(f"held out {name}: F1 {report['f1']:.4f}", flush=True)
    scores["held_out"] = unseen
    scores["decoder_outcomes"] = dict(program.outcomes)
    return finish(network, record, fitted, scores, out)


# The instruction GNER-T5 checkpoints were trained with (the paper's repository,
# configs/instruction_configs/instruction.json), then its label list and sentence wording.
GNER_INSTRUCTION = (
    "Please analyze the sentence provided, identifying the type of entity for each word on a token-by-token basis.\n"
    "Output format is: word_1(label_1), word_2(label_2), ...\n"
    "We'll use the BIO-format to label the entities, where:\n"
    "1. B- (Begin) indicates the start of a named entity.\n"
    "2. I- (Inside) is used for words within a named entity but are not the first word.\n"
    "3. O (Outside) denotes words that are not part of a named entity.\n"
    "\nUse the specific entity tags:"
)


def import_seq2seq(folder: Path, out: Path, labels: Sequence[str], lora_rank: int = 8) -> Manifest:
    """A Hugging Face T5-family folder (GNER-T5, Flan-T5) as a servable gner model in OUT: the
    manifest names the folder (by path and sha256) and carries GNER's prompt; the weights file holds
    the untrained adapters (LoRA B = 0: the folder's own function). Free generation by default,
    as the checkpoints were trained to write `word(tag)` text unconstrained."""
    from transformers import AutoConfig

    from nerserve.ner.backbone import resolve_backbone
    from nerserve.ner.lora import LoraSettings, save_weights
    from nerserve.ner.model_store import WEIGHTS, write_manifest
    from nerserve.ner.training.loop import TrainSettings

    backbone = resolve_backbone(str(folder))
    shape = AutoConfig.from_pretrained(str(folder))
    if not getattr(shape, "is_encoder_decoder", False):
        raise ValueError(f"{folder}: not an encoder-decoder (seq2seq) model folder")
    config = GnerConfig(
        labels=tuple(labels),
        kind="t5",
        instruction=GNER_INSTRUCTION,
        label_separator=",",
        sentence_marker="and O.\nSentence:",
        decoder_layers=int(shape.num_decoder_layers),
        decoder_heads=int(shape.num_heads),
        head_dim=int(shape.d_kv),
        decode=GnerOptions(constrained=False),
    )
    lora = LoraSettings(rank=lora_rank, alpha=2 * lora_rank)
    network = build_network(SPEC, config, backbone, lora)
    save_weights(network, out / WEIGHTS)
    record = ModelRecord(
        out.name, SPEC.name, config.to_dict(), backbone, lora, Path("conll03"), TrainSettings(), {"imported": str(folder)}
    )
    manifest = record.manifest({"status": "imported: the folder's own weights, not trained here"}, {}, out / WEIGHTS)
    write_manifest(out, manifest)
    return manifest
