"""The contract every architecture implements (design layer 2: numpy, pydantic, no torch).

An architecture is one folder `ner/archs/<name>/` whose `__init__.py` exports `SPEC`, an
`ArchitectureSpec`: its config class, its decoding options (defaults and bounds declared once, as a
pydantic dataclass), its program (a `ProgramBase`), its graph signatures as a function of its
config, its decode-tuning grid, its capabilities, and where its torch network and trainer live
(imported lazily, so that this layer never imports torch). The registry, the command line,
loading, tuning, export, the service and the tests are all derived from the registered specs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from pydantic import ValidationError

from nerserve.ner.archs.grouping import in_batch_order, length_groups
from nerserve.ner.graph import Graph, GraphSignature
from nerserve.ner.text.subword import SubwordEncoder, Words, word_count
from nerserve.ner.types import EntitySet

# Decoding settings that come from the model's training data, never from a request's options
# (`labels` of an open-label model comes from the request's own top-level field).
MODEL_LEVEL_OPTIONS = frozenset({"overlap", "labels"})


class OptionError(ValueError):
    """A per-request option that is unknown or out of range; `field` names it (`options.<name>`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Config(Protocol):
    """An architecture's hyper-parameters, labels and default decoding options (a manifest's `config`)."""

    @property
    def labels(self) -> tuple[str, ...]: ...
    @property
    def decode(self) -> Any: ...
    def to_dict(self) -> dict[str, Any]: ...


class Batch(Protocol):
    """What every architecture's prepared batch tells the batcher and the runner."""

    lengths: list[int]  # words per sentence
    padded_tokens: int  # sub-word positions of the encoder input, padding included


@dataclass(frozen=True)
class Capabilities:
    nested: bool = False
    discontinuous: bool = False
    open_labels: bool = False  # the label set comes with each request
    autoregressive: bool = False  # a decoder graph called step by step with a key/value cache
    # its decoder writes the whole sentence back (GNER: ~5 tokens a word, where a pointer decoder
    # writes a few an entity), so its loops are the longest of all
    writes_every_word: bool = False


C = TypeVar("C", bound=Config)
B = TypeVar("B", bound=Batch)
O = TypeVar("O")  # noqa: E741 - the options type, as C and B


class ProgramBase(Generic[C, B, O]):
    """Runs one architecture's graphs for a batch of sentences (numpy in, numpy out).

    The same program serves training-time evaluation (eager graphs), export parity and the
    service (ONNX Runtime / TorchScript graphs). Subclasses implement `prepare`, `run`,
    `decode` and `export_values`; options may differ per sentence (a batch carries several
    requests), and `None` means the config's defaults.
    """

    def __init__(
        self, graphs: Mapping[str, Graph], config: C, subwords: SubwordEncoder, signatures: Mapping[str, GraphSignature]
    ) -> None:
        missing = [name for name in signatures if name not in graphs]
        if missing:
            raise ValueError(f"{type(self).__name__} needs graphs {missing}")
        for name, signature in signatures.items():
            signature.check(graphs[name], name)
        self.graphs = graphs
        self.config = config
        self.subwords = subwords
        # how generated sequences ended (generative decoders count drops; empty for the others)
        self.outcomes: Counter[str] = Counter()

    # the most sub-words of one sentence window the architecture handles well (None: the
    # backbone's positions are the only bound); the service windows longer sentences to it
    window_subwords: int | None = None

    def check_options(self, options: O) -> None:
        """Refuse (OptionError) a request's options the graphs cannot take, e.g. a label list too long."""

    def per_sentence(self, options: O | Sequence[O] | None, count: int) -> list[O]:
        if isinstance(options, Sequence):
            return list(options)
        return [options if options is not None else self.config.decode] * count

    def prepare(self, sentences: Sequence[Words]) -> B:
        raise NotImplementedError

    def run(self, batch: B, options: O | Sequence[O] | None = None) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def decode(self, batch: B, outputs: Mapping[str, np.ndarray], options: O | Sequence[O] | None = None) -> list[EntitySet]:
        raise NotImplementedError

    def export_values(self, batch: B) -> dict[str, np.ndarray]:
        """Every graph input and output for a batch, as export examples (distinct axis sizes)."""
        raise NotImplementedError

    def predict(self, sentences: Sequence[Words], options: O | Sequence[O] | None = None) -> list[EntitySet]:
        """The batch's entity sets; on the CPU, run in groups of similar word counts (grouping.length_groups)."""
        groups = self.length_groups(sentences)
        if len(groups) == 1:
            return self._predict_whole(sentences, options)
        per_sentence = options if isinstance(options, Sequence) else None
        results = [
            self._predict_whole(
                [sentences[row] for row in rows], [per_sentence[row] for row in rows] if per_sentence is not None else options
            )
            for rows in groups
        ]
        return in_batch_order(groups, results)

    def length_groups(self, sentences: Sequence[Words]) -> list[np.ndarray]:
        """Where the graphs run on the CPU, the batch's groups of similar word counts; one group where
        they keep their outputs on a device, which pays less for padding than for another pass."""
        if any(graph.device_resident for graph in self.graphs.values()):
            return [np.arange(len(sentences), dtype=np.int64)]
        return length_groups([word_count(sentence) for sentence in sentences])

    def _predict_whole(self, sentences: Sequence[Words], options: O | Sequence[O] | None) -> list[EntitySet]:
        batch = self.prepare(sentences)
        return self.decode(batch, self.run(batch, options), options)


@dataclass(frozen=True)
class Tuning(Generic[O]):
    """The decoding options tuned on dev, and (optionally) the options to run the graphs with once
    for the whole grid: they must not exclude any grid point's results."""

    grid: Mapping[str, Sequence[Any]]
    run_options: Callable[[O, Mapping[str, Sequence[Any]]], O] | None = None


@dataclass(frozen=True)
class ArchitectureSpec(Generic[C, O]):
    name: str
    config: type[C]  # with from_dict(manifest config) and to_dict()
    options: type[O]  # a frozen pydantic dataclass: defaults and bounds of every decoding option
    program: type[ProgramBase[Any, Any, Any]]
    signatures: Callable[[C], dict[str, GraphSignature]]  # graph name → signature, from the config
    capabilities: Capabilities
    tuning: Tuning[O]
    network: str  # "module:Class" of the torch network (config → nn.Module), imported where torch is
    trainer: str  # "module:function" training it from a data folder
    int8_graphs: tuple[str, ...] = ("encoder",)  # graphs INT8 quantisation may touch
    # graphs holding the pretrained transformer: ONNX export runs the transformer fusions on them
    backbone_graphs: tuple[str, ...] = ("encoder",)

    def config_from(self, values: Mapping[str, Any]) -> C:
        return self.config.from_dict(dict(values))  # type: ignore[attr-defined, no-any-return]

    def build_program(self, graphs: Mapping[str, Graph], config: Mapping[str, Any] | C, subwords: SubwordEncoder) -> Any:
        parsed = self.config_from(config) if isinstance(config, Mapping) else config
        return self.program(graphs, parsed, subwords, self.signatures(parsed))

    def option_names(self) -> tuple[str, ...]:
        """The options a request may set (model-level settings such as the overlap rule excluded)."""
        return tuple(f.name for f in dataclasses.fields(self.options) if f.name not in MODEL_LEVEL_OPTIONS)  # type: ignore[arg-type]

    def option_defaults(self, defaults: O) -> dict[str, Any]:
        return {name: getattr(defaults, name) for name in self.option_names()}

    def request_options(self, defaults: O, raw: Mapping[str, Any], labels: Sequence[str] | None) -> O:
        """A request's options and, for an open-label model, its label names (required there)."""
        options = self.resolve_options(defaults, raw)
        if not self.capabilities.open_labels:
            return options
        if not labels:
            raise OptionError("labels", 'this open-label model needs the entity types to find, e.g. ["person", "drug"]')
        return dataclasses.replace(options, labels=tuple(labels))  # type: ignore[type-var]

    def resolve_options(self, defaults: O, raw: Mapping[str, Any]) -> O:
        """A request's options over the model's defaults; OptionError names the first bad one."""
        if not raw:  # nearly every request: nothing to check
            return defaults
        known = self.option_names()
        for name in raw:
            if name not in known:
                raise OptionError(f"options.{name}", f"unknown option; known: {', '.join(known)}")
        try:
            return dataclasses.replace(defaults, **raw)  # type: ignore[type-var]
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or next(iter(raw))
            raise OptionError(f"options.{where}", str(first["msg"]).removeprefix("Value error, ")) from None
