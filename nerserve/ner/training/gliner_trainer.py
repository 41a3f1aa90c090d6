"""Train the label-matching architecture on every set of the data folder with its natural label
names (open-label training).

Each epoch draws a fresh sample balanced across the sets. Each example asks for its set's label
names (all of them: a name of the set absent from the sentence is a true negative), some dropped
(their entities are then not asked for), some replaced by a synonym or paraphrase (the entity
follows the new name), and names of the other domain's sets added as negatives, in random order:
so that a name is read, not memorised. Negatives come from the other domain only, since a
same-domain name may be an unannotated type of the sentence's set ("date" in CoNLL-2003).
Model selection on the dev splits of the selection sets (`SELECTION`), scored zero-shot when they
are held out of training.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nerserve.ner.archs.gliner import SPEC, THRESHOLDS
from nerserve.ner.archs.gliner.config import GlinerConfig, GlinerOptions
from nerserve.ner.archs.gliner.loss import gliner_loss, pair_mask, targets_of
from nerserve.ner.archs.gliner.program import GlinerProgram, Pass
from nerserve.ner.data import Sentence, named_split
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.model_store import Manifest
from nerserve.ner.runner import score
from nerserve.ner.training.decode_tuning import tune_decoding
from nerserve.ner.training.label_synonyms import SYNONYMS
from nerserve.ner.training.loop import DEV_SLICE, ModelRecord, finish, fit, start_run, warm_start
from nerserve.ner.training.wordnet_types import MentionTypes, WordNet
from nerserve.ner.types import Entity, EntitySet

BIOMEDICAL = frozenset({"anatem", "bc2gm", "bc5cdr", "ncbi", "genia", "cadec"})
EVALUATION_HELD_OUT = ("harveyner", "broad_twitter_corpus", "fabner")  # unseen domains of the recipe run
SELECTION = ("tweetner7", "anatem")  # model selection: their dev splits
MAX_WORDS = 64  # longer training sentences are left out (spans grow with words × max_width)
MAX_SUBWORDS = 192  # and those of more sub-words (the prompt needs its room beside them)
MAX_LABELS = 25
SELECTION_DEV = 400  # dev sentences of each selection set scored after every epoch
# test sentences of each set the manifest's scores cover (eager torch is slow on CPU; the full test
# sets are scored through the service, benchmarks/service_eval.py)
TEST_SCORED = 1000


@dataclass(frozen=True)
class Source:
    name: str
    sentences: list[Sentence]  # entity types already the natural label names
    labels: tuple[str, ...]


def continuous(sentences: list[Sentence]) -> list[Sentence]:
    """Sentences with a discontinuous entity left out: its words would teach a false negative."""
    return [s for s in sentences if not any(e.is_discontinuous for e in s.entities)]


def data_folders(data_root: Path) -> list[Path]:
    named = [data_root / name for name in ("conll03", "genia", "cadec")]
    return [*named, *sorted(p for p in (data_root / "open").iterdir() if (p / "train.jsonl").is_file())]


def training_sources(data_root: Path, held_out: Sequence[str]) -> list[Source]:
    sources = []
    for folder in data_folders(data_root):
        if folder.name in held_out:
            continue
        sentences, labels = named_split(folder, "train")
        usable = [s for s in continuous(sentences) if 0 < len(s.tokens) <= MAX_WORDS]
        sources.append(Source(folder.name, usable, labels))
    return sources


def fitting(sources: list[Source], program: GlinerProgram) -> list[Source]:
    """Each source's sentences of at most MAX_SUBWORDS sub-words."""
    kept = []
    for source in sources:
        tokenized = program.subwords.tokenize([list(s.tokens) for s in source.sentences])
        usable = [s for s, t in zip(source.sentences, tokenized, strict=True) if t.subwords <= MAX_SUBWORDS]
        kept.append(Source(source.name, usable, source.labels))
    return kept


def sample_mixture(sources: list[Source], size: int, rng: random.Random) -> list[tuple[Sentence, int]]:
    """`size` examples evenly over the sources (a small source gives all it has)."""
    share = size // len(sources)
    picked = []
    for index, source in enumerate(sources):
        picked += [(s, index) for s in rng.sample(source.sentences, min(share, len(source.sentences)))]
    rng.shuffle(picked)
    return picked


def other_domain(sources: list[Source], names: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per source: the names of the other domain's sources (biomedical vs general) that are not
    its own labels. Never its own domain's: a same-domain name may be an unannotated type of its set
    ("date" in CoNLL-2003)."""
    negatives = {}
    for source in sources:
        medical = source.name in BIOMEDICAL
        pooled = set().union(*(names[s.name] for s in sources if (s.name in BIOMEDICAL) != medical))
        negatives[source.name] = sorted(pooled - set(source.labels))
    return negatives


def domain_negatives(sources: list[Source]) -> dict[str, list[str]]:
    """Per source: the label names of the other domain's sets that are not its own."""
    return other_domain(sources, {s.name: set(s.labels) for s in sources})


@dataclass(frozen=True)
class Widening:
    """How often an asked name is swapped for another: a synonym or paraphrase of the name
    (`renamed_share`), or a WordNet sub-type of its mentions (`wordnet_share`, with `types` to find
    them and other-domain type names to ask as negatives)."""

    renamed_share: float = 0.3
    wordnet_share: float = 0.0
    types: MentionTypes | None = None
    negatives: dict[str, list[str]] = field(default_factory=dict)  # per source: WordNet names of the other domain
    common_noun_share: float = 0.0  # chance that an example asks for kinds of its common nouns instead
    kept_names: frozenset[str] = frozenset()  # the sets' names and their synonyms: never a common-noun kind
    lowercase_share: float = 0.0  # chance that an example's words are all lowercased


def mention_words(sentence: Sentence, entity: Entity) -> tuple[str, ...]:
    return tuple(sentence.tokens[i] for i in sorted(entity.words()))


def subtype(sentence: Sentence, name: str, taken: set[str], types: MentionTypes, rng: random.Random) -> str | None:
    """A WordNet sub-type of one of the sentence's `name` mentions, where WordNet types every one
    of them (so that a mention it does not cover never becomes a false negative)."""
    ordered = sorted((e for e in sentence.entities if e.type == name), key=lambda e: e.fragments)  # set order varies by run
    mentions = [types.types(mention_words(sentence, e), name) for e in ordered]
    if not mentions or not all(mentions):
        return None
    choices = [t for t in rng.choice(mentions) if t not in taken]
    return rng.choice(choices) if choices else None


def ask(
    sentence: Sentence, source: Source, negatives: list[str], rng: random.Random, widening: Widening = Widening()
) -> tuple[Sentence, tuple[str, ...]]:
    """One training example: the label names asked (dropped, some renamed by a synonym or a WordNet
    sub-type, negatives added, shuffled) and the sentence's entities under those names (under a
    sub-type, only the mentions WordNet puts under it)."""
    kept = list(source.labels)
    if len(kept) > 1 and rng.random() < 0.5:
        kept = [name for name in kept if rng.random() > 0.3] or [rng.choice(kept)]
    renamed: dict[str, str] = {}
    subtyped: set[str] = set()
    taken = set(source.labels)
    for name in kept:
        draw = rng.random() if name in SYNONYMS or widening.wordnet_share > 0 else 1.0
        if name in SYNONYMS and draw < widening.renamed_share:
            renamed[name] = rng.choice(SYNONYMS[name])
        elif widening.types and draw < widening.renamed_share + widening.wordnet_share:
            other = subtype(sentence, name, taken | set(renamed.values()), widening.types, rng)
            if other:
                subtyped.add(name)
            renamed[name] = other or name
        else:
            renamed[name] = name
    asked = list(renamed.values())
    room = MAX_LABELS - len(asked)
    if room > 0 and rng.random() < 0.8:
        pool = [n for n in negatives if n not in asked]
        wordnet_pool = [n for n in widening.negatives.get(source.name, []) if n not in asked and n not in pool]
        count = min(room, rng.randint(1, 8))
        from_wordnet = sum(rng.random() < widening.wordnet_share for _ in range(count)) if wordnet_pool else 0
        asked += rng.sample(pool, min(len(pool), count - from_wordnet))
        asked += rng.sample(wordnet_pool, min(len(wordnet_pool), from_wordnet))
    rng.shuffle(asked)

    def under_its_name(entity: Entity) -> bool:
        if entity.type not in subtyped or widening.types is None:
            return entity.type in renamed
        return renamed[entity.type] in widening.types.types(mention_words(sentence, entity), entity.type)

    entities = [replace(e, type=renamed[e.type]) for e in sentence.entities if under_its_name(e)]
    return Sentence(sentence.tokens, EntitySet(entities)), tuple(asked)


def common_noun_example(
    sentence: Sentence, negatives: list[str], rng: random.Random, types: MentionTypes, kept_names: frozenset[str]
) -> tuple[Sentence, tuple[str, ...]] | None:
    """An example that asks for one to three WordNet kinds of the sentence's common nouns ("road"
    for "highway" and "street"), each noun outside its annotated entities a mention of every asked
    kind it has, and an annotated entity one where WordNet types it so: what the sets' ~70 names,
    all but a few for proper names, never teach (GLiNER's training data names ~13,000 kinds)."""
    wordnet, inside = types.wordnet, set().union(*(e.words() for e in sentence.entities))
    nouns = {i: wordnet.common_noun(w) for i, w in enumerate(sentence.tokens) if i not in inside}
    kinds = {i: [k for k in wordnet.kinds(s) if k not in kept_names] for i, s in nouns.items() if s is not None}
    kinds = {i: k for i, k in kinds.items() if k}
    if not kinds:
        return None
    asked = list(dict.fromkeys(rng.choice(kinds[rng.choice(sorted(kinds))]) for _ in range(rng.randint(1, 3))))
    entities = [Entity(k, ((i, i + 1),)) for i, names in kinds.items() for k in asked if k in names]
    for e in sentence.entities:
        entities += [Entity(k, e.fragments) for k in types.types(mention_words(sentence, e), e.type) if k in asked]
    pool = [n for n in negatives if n not in asked]
    asked += rng.sample(pool, min(len(pool), rng.randint(0, 6)))
    rng.shuffle(asked)
    return Sentence(sentence.tokens, EntitySet(entities)), tuple(asked)


def lowercased(sentence: Sentence) -> Sentence:
    """The sentence as a query or a tweet is often typed: no capitals, the entities where they were.
    The backbone is uncased, but the character CNN and the shape embedding see case, and without
    such examples a name's capital letters become what finds it."""
    return Sentence(tuple(word.lower() for word in sentence.tokens), sentence.entities)


def example_of(
    sentence: Sentence, source: Source, negatives: list[str], rng: random.Random, widening: Widening
) -> tuple[Sentence, tuple[str, ...]]:
    """An example of the sentence, lowercased with chance `lowercase_share` (general-domain sets
    only: biomedical text is not typed so, and its case tells genes apart): a common-noun example
    with chance `common_noun_share` (where the sentence has such nouns), else `ask`."""
    general = source.name not in BIOMEDICAL
    if general and widening.lowercase_share > 0 and rng.random() < widening.lowercase_share:
        sentence = lowercased(sentence)
    if widening.types and widening.common_noun_share > 0 and rng.random() < widening.common_noun_share:
        pool = negatives + widening.negatives.get(source.name, [])
        example = common_noun_example(sentence, pool, rng, widening.types, widening.kept_names)
        if example:
            return example
    return ask(sentence, source, negatives, rng, widening)


def wordnet_negatives(sources: list[Source], types: MentionTypes) -> dict[str, list[str]]:
    """Per source: the WordNet sub-types of the other domain's mentions."""

    def kinds_of(source: Source) -> set[str]:
        mentions = [(mention_words(sentence, e), e.type) for sentence in source.sentences for e in sentence.entities]
        return {t for words, label in mentions for t in types.types(words, label)}

    return other_domain(sources, {s.name: kinds_of(s) for s in sources})


def selection_sets(data_root: Path) -> list[Source]:
    sets = []
    for name in SELECTION:
        sentences, labels = named_split(data_root / "open" / name, "dev", SELECTION_DEV)
        sets.append(Source(name, sentences, labels))
    return sets


def within_window(sentences: list[Sentence], program: GlinerProgram) -> list[Sentence]:
    """Sentences a pass takes whole (the service windows longer ones; training-time scoring does not)."""
    tokenized = program.subwords.tokenize([list(s.tokens) for s in sentences])
    return [s for s, t in zip(sentences, tokenized, strict=True) if t.subwords <= program.window_subwords]


def asking(program: GlinerProgram, options: GlinerOptions) -> Callable[[list[list[str]]], list[EntitySet]]:
    return lambda sentences: program.predict(sentences, options)


def macro_f1(program: GlinerProgram, sets: list[Source], options: GlinerOptions, batch_size: int) -> dict[str, Any]:
    reports = {}
    for source in sets:
        asked = replace(options, labels=source.labels)
        reports[source.name] = score(asking(program, asked), source.sentences, batch_size)
    f1 = float(np.mean([r["f1"] for r in reports.values()]))
    return {
        "f1": f1,
        "precision": float(np.mean([r["precision"] for r in reports.values()])),
        "recall": float(np.mean([r["recall"] for r in reports.values()])),
        "sets": {k: round(float(r["f1"]), 4) for k, r in reports.items()},
    }


def train_gliner(
    data_dir: Path, out: Path, settings: Any, backbone_spec: str | None = None, device: str | None = None
) -> Manifest:
    """`data_dir` is any set folder of the data root (conll03): every set beside it is used, but
    `settings.held_out` (comma-separated set names, e.g. the evaluation run's)."""
    data_root = data_dir.parent
    held_out = tuple(x for x in (settings.held_out or "").split(",") if x)
    run = start_run(data_dir, settings, backbone_spec, device)
    torch_device, backbone, lora = run.device, run.backbone, run.lora
    sources = training_sources(data_root, held_out)
    seen = sorted({name for s in sources for name in s.labels})
    config = GlinerConfig(labels=tuple(seen), max_width=settings.max_width or 12)
    network = build_network(SPEC, config, backbone, lora).to(torch_device)
    program: GlinerProgram = eager_program(SPEC, network, backbone, torch_device)
    sources = fitting(sources, program)
    negatives = domain_negatives(sources)
    widening = Widening(settings.renamed_share, lowercase_share=settings.lowercase_share)
    if settings.wordnet_share > 0 or settings.common_noun_share > 0:
        types = MentionTypes(WordNet.load())
        kept_names = frozenset(n for s in sources for n in s.labels) | {n for names in SYNONYMS.values() for n in names}
        widening = replace(
            widening,
            wordnet_share=settings.wordnet_share,
            types=types,
            negatives=wordnet_negatives(sources, types),
            common_noun_share=settings.common_noun_share,
            kept_names=kept_names,
        )
    selection = [Source(s.name, within_window(s.sentences, program), s.labels) for s in selection_sets(data_root)]
    size = settings.train_limit or 20000
    mixture = sample_mixture(sources, size, random.Random(f"{settings.seed}:0"))
    train = [sentence for sentence, _ in mixture]

    def resample(epoch: int) -> None:  # a fresh sample each epoch
        mixture[:] = sample_mixture(sources, size, random.Random(f"{settings.seed}:{epoch}"))
        train[:] = [sentence for sentence, _ in mixture]

    extra: dict[str, Any] = {
        "sources": {s.name: {"sentences": len(s.sentences), "labels": list(s.labels)} for s in sources},
        "held_out": list(held_out),
        "selection": list(SELECTION),
        "mixture": len(train),
        "renamed_share": settings.renamed_share,
        "wordnet_share": settings.wordnet_share,
        "common_noun_share": settings.common_noun_share,
        "lowercase_share": settings.lowercase_share,
        "focal_gamma": settings.focal_gamma,
        "focal_alpha": settings.focal_alpha,
    }
    if settings.init_from:
        extra["warm_start"] = warm_start(network, settings.init_from, backbone, SPEC.name)
    record = ModelRecord(out.name, SPEC.name, config.to_dict(), backbone, lora, data_dir, settings, extra, run.words)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    print(f"gliner: {len(sources)} sources, {len(train)} examples an epoch, {trainable:,} trainable parameters", flush=True)
    label_rng = random.Random(settings.seed + 1)

    def loss_of(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        examples = []
        for i in indices:
            sentence, source = mixture[i][0], sources[mixture[i][1]]
            examples.append(example_of(sentence, source, negatives[source.name], label_rng, widening))
        batch = program.prepare([list(sentence.tokens) for sentence, _ in examples])
        labels = [names for _, names in examples]
        feeds = program.feeds(batch, [Pass(b, 0, names) for b, names in enumerate(labels)])
        inputs = {k: torch.from_numpy(v).to(torch_device) for k, v in feeds.items()}
        targets = torch.from_numpy(targets_of(batch.spans, [s.entities for s, _ in examples], labels)).to(torch_device)
        mask = torch.from_numpy(pair_mask(batch.span_mask, labels)).to(torch_device)
        return gliner_loss(network, inputs, targets, mask, settings.focal_gamma, settings.focal_alpha), {}

    def dev_score() -> dict[str, Any]:
        return macro_f1(program, selection, config.decode, settings.eval_batch_size)

    fitted = fit(network, program.predict, loss_of, train, [], record, out, dev_score=dev_score, before_epoch=resample)
    return finish_gliner(network, program, record, fitted, data_root, selection, held_out, settings, out)


def dev_slice(program: GlinerProgram, data_root: Path, batch_size: int) -> dict[str, Any]:
    """F1 on the first DEV_SLICE CoNLL-2003 dev sentences asked for its four names (what
    tests/test_regression.py re-scores)."""
    sentences, labels = named_split(data_root / "conll03", "dev", DEV_SLICE)
    report = score(asking(program, replace(program.config.decode, labels=labels)), sentences, batch_size)
    return {"f1": report["f1"], "sentences": len(sentences)}


def choose_threshold(program: GlinerProgram, selection: list[Source], batch_size: int) -> tuple[float, float]:
    """The threshold with the best macro F1 over the selection sets' dev (graphs run once a set)."""
    table: dict[float, list[float]] = {}
    config = program.config
    for source in selection:
        program.config = replace(config, decode=replace(config.decode, labels=source.labels))
        _, _, points = tune_decoding(program, source.sentences, batch_size, {"threshold": THRESHOLDS})
        for point in points:
            table.setdefault(point["threshold"], []).append(point["f1"])
    program.config = config
    threshold, f1s = max(table.items(), key=lambda item: float(np.mean(item[1])))
    return threshold, float(np.mean(f1s))


def gliner_scores(program: GlinerProgram, data_root: Path, held_out: Sequence[str], batch_size: int) -> dict[str, Any]:
    """Selection dev, the CoNLL-2003 dev slice, CoNLL-2003 and GENIA test (nested), and each held-out
    set's test: the first TEST_SCORED sentences of each, those a pass takes whole (the official
    figures are measured through the service, benchmarks/service_eval.py)."""
    best = program.config.decode
    selection = [Source(s.name, within_window(s.sentences, program), s.labels) for s in selection_sets(data_root)]
    scores: dict[str, Any] = {"dev": macro_f1(program, selection, best, batch_size)}
    scores["dev_slice"] = dev_slice(program, data_root, batch_size)
    for name, nested in (("conll03", False), ("genia", True)):
        sentences, labels = named_split(data_root / name, "test", TEST_SCORED)
        report = score(
            asking(program, replace(best, labels=labels, nested=nested)), within_window(sentences, program), batch_size
        )
        scores[f"test_{name}"] = {k: report[k] for k in ("precision", "recall", "f1", "sentences")}
        print(f"{name} test F1 {report['f1']:.4f}", flush=True)
    unseen = {}
    for name in (n for n in held_out if n not in SELECTION):
        sentences, labels = named_split(data_root / "open" / name, "test", TEST_SCORED)
        report = score(asking(program, replace(best, labels=labels)), within_window(sentences, program), batch_size)
        unseen[name] = {k: report[k] for k in ("precision", "recall", "f1", "sentences")}
        print(f"held out {name}: F1 {report['f1']:.4f}", flush=True)
    if unseen:
        scores["held_out"] = unseen
        scores["held_out_macro_f1"] = float(np.mean([r["f1"] for r in unseen.values()]))
    return scores


def finish_gliner(
    network: torch.nn.Module,
    program: GlinerProgram,
    record: ModelRecord,
    fitted: Any,
    data_root: Path,
    selection: list[Source],
    held_out: tuple[str, ...],
    settings: Any,
    out: Path,
) -> Manifest:
    """The threshold chosen on the selection sets' dev, then the scores (gliner_scores)."""
    threshold, f1 = choose_threshold(program, selection, settings.eval_batch_size)
    config: GlinerConfig = replace(program.config, decode=replace(program.config.decode, threshold=threshold))
    network.config = config  # type: ignore[assignment]
    program.config = config
    record.config = config.to_dict()
    print(f"threshold {threshold}: selection dev macro F1 {f1:.4f}", flush=True)
    scores = gliner_scores(program, data_root, held_out, settings.eval_batch_size)
    return finish(network, record, fitted, scores, out)


def retune_gliner(folder: Path, data_root: Path, batch_size: int = 64) -> dict[str, Any]:
    """Re-choose a trained gliner model's threshold on the selection sets' dev and re-score it
    (`nerserve tune`), its manifest rewritten."""
    from nerserve.ner.loading import load_model
    from nerserve.ner.model_store import read_manifest, write_manifest

    model = load_model(folder)
    program: GlinerProgram = model.program
    manifest = read_manifest(model.folder)
    selection = [Source(s.name, within_window(s.sentences, program), s.labels) for s in selection_sets(data_root)]
    before = program.config.decode.threshold
    threshold, f1 = choose_threshold(program, selection, batch_size)
    program.config = replace(program.config, decode=replace(program.config.decode, threshold=threshold))
    manifest.config["decode"]["threshold"] = threshold
    manifest.scores = gliner_scores(program, data_root, manifest.training.get("held_out", []), batch_size)
    manifest.training["decode_tuning"] = {"grid": {"threshold": list(THRESHOLDS)}, "before": before, "chosen": threshold}
    write_manifest(model.folder, manifest)
    return {"threshold_before": before, "threshold": threshold, "selection_dev_macro_f1": f1, **manifest.scores}
