"""Every API shape (pydantic v2), with the examples the OpenAPI docs show."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from nerserve.ner.text.segment import WordStyle


def _label_rule(value: object) -> object:
    """The label pattern's rule said in words (pydantic's own message would quote the pattern)."""
    if isinstance(value, str) and value and (value.isspace() or "(" in value or ")" in value):
        raise PydanticCustomError("label_name", "a label name needs a character other than white space, and no '(' or ')'")
    return value


# An entity type asked of an open-label model: its name as the model reads it in the prompt and
# writes it back inside `word(B-name)`, hence no parentheses. The OpenAPI schema states the rule as a
# pattern; `_label_rule` checks it, once, and says it in words.
LabelName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, strip_whitespace=False),
    BeforeValidator(_label_rule),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[^()]*\S[^()]*$"}),
]


class ExtractRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "span-conll03", "texts": ["EU rejects German call to boycott British lamb."]},
                {"model": "span-genia", "tokens": [["IL-2", "gene", "expression", "requires", "NF-kappa", "B"]]},
                {"model": "gner-open", "texts": ["Aspirin eased her headache."], "labels": ["drug", "symptom"]},
            ],
            # what `exactly_one_input` enforces, said in the schema clients generate code from
            "oneOf": [{"required": ["texts"]}, {"required": ["tokens"]}],
        },
    )

    model: str | None = Field(None, min_length=1, description="model name (GET /models); the server default when absent")
    # not nullable in the schema: a request gives one of the two, and leaves the other out
    texts: list[str] | SkipJsonSchema[None] = Field(None, description="raw texts of any length: split into sentences, windowed")
    tokens: list[list[str]] | SkipJsonSchema[None] = Field(None, description="pre-tokenised sentences (lists of words)")
    labels: list[LabelName] | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="entity types to find (1–100 distinct names of 1–64 characters, no parentheses): required by "
        "open-label models (GET /models: capabilities.open_labels), which read them as their prompt; for the others "
        "a filter on their own labels (an unknown one is a 422 naming it)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="the architecture's per-request options")
    deadline_ms: float | None = Field(
        None, gt=0, strict=True, allow_inf_nan=False, description="answer 504 if not started within this time"
    )
    flat: bool = Field(
        False, strict=True, description="non-overlapping entities only (the highest scores kept), for BIO / doc.ents"
    )

    @field_validator("texts", "tokens", mode="before")
    @classmethod
    def absent_not_null(cls, value: Any, info: ValidationInfo) -> Any:
        """As the schema says: the input not given is left out, not null."""
        if value is None:
            raise ValueError(f"{info.field_name}: a list, or leave the field out")
        return value

    @field_validator("texts", "tokens", "labels")
    @classmethod
    def no_lone_surrogates(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        """JSON may carry lone UTF-16 surrogates ("\\ud800"); no tokenizer can encode them."""
        for index, item in enumerate(value or []):
            for inner, text in enumerate(item if isinstance(item, list) else [item]):
                if not text.isascii() and _has_lone_surrogate(text):
                    where = f"{info.field_name}[{index}]" + (f"[{inner}]" if isinstance(item, list) else "")
                    raise ValueError(f"{where}: contains a lone surrogate (invalid Unicode)")
        return value

    @field_validator("labels")
    @classmethod
    def distinct_labels(cls, labels: list[str] | None) -> list[str] | None:
        if labels is not None:
            seen: set[str] = set()
            for index, label in enumerate(labels):
                if label in seen:
                    raise ValueError(f"labels[{index}]: duplicate label {label!r}")
                seen.add(label)
        return labels

    @model_validator(mode="after")
    def exactly_one_input(self) -> ExtractRequest:
        if (self.texts is None) == (self.tokens is None):
            raise ValueError("give exactly one of 'texts' or 'tokens'")
        return self


def _has_lone_surrogate(text: str) -> bool:
    # UTF-8 cannot encode a surrogate: the encoder finds one at C speed
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class EntityOut(BaseModel):
    type: str
    text: str = Field(description="the fragments' surfaces joined by one space")
    score: float
    start: int = Field(description="character offset where the entity's whole extent starts (its first fragment)")
    end: int = Field(description="character offset where its whole extent ends (exclusive; its last fragment)")
    spans: list[tuple[int, int]] = Field(description="character offsets [start, end) per fragment (code points)")
    token_spans: list[tuple[int, int]] = Field(description="word offsets [start, end) per fragment")


class ResultOut(BaseModel):
    entities: list[EntityOut]


class ExtractResponse(BaseModel):
    model: str
    version: str
    results: list[ResultOut]


class FullBatchWarmUp(BaseModel):
    sentences: int
    sentence_subwords: int = Field(description="each sentence's sub-words, specials included")
    ms: float


class WarmUpInfo(BaseModel):
    """The passes a model ran before it reported ready, through the path requests take."""

    one_sentence_first_ms: float = Field(description="a lone sentence's first pass, where first-call costs show")
    one_sentence_last_ms: float = Field(description="the same sentence's last pass, once warm")
    full_batch: FullBatchWarmUp | None = Field(
        None, description="a batch at the batch limits (on CUDA by default: the device's memory holds them)"
    )


class ModelInfo(BaseModel):
    """A served model; while it loads or after it failed, only its name, state and error."""

    name: str
    state: str = Field(description="loading, ready, failed (to load) or broken (its graphs stopped working while serving)")
    error: str | None = Field(None, description="why it failed to load, or stopped working")
    architecture: str | None = None
    version: str | None = None
    labels: list[str] | None = None
    capabilities: dict[str, bool] | None = None
    options: dict[str, Any] | None = Field(None, description="per-request options with their defaults")
    runtime: str | None = None
    precision: str | None = Field(None, description="what its graphs compute in: fp32, fp16, bf16 or int8")
    execution_providers: dict[str, str] | None = Field(None, description="what each graph actually runs on")
    warm_up: WarmUpInfo | None = None
    scores: dict[str, Any] | None = None
    words: WordStyle | None = Field(
        None, description="how raw texts are cut into words for it, as its training data writes them"
    )


class ModelsResponse(BaseModel):
    default: str | None
    models: list[ModelInfo]


class InfoResponse(BaseModel):
    version: str
    python: str
    runtime: str
    precision: str = Field(description="what the graphs compute in: fp32, fp16 or bf16 (--precision), int8 (--int8)")
    device: str
    simulated_device: dict[str, str | float | int] | None = Field(
        None, description="--device simulated: the card it stands in for, where its costs come from, busy seconds, passes"
    )
    http_workers: int = Field(description="HTTP worker processes in front of the engine process (1: one process)")
    graph_processes: int = Field(
        0, description="the processes each model's graphs run in (--graph-process, --graph-processes; 0: the engine's own)"
    )
    default_model: str | None
    models: dict[str, str] = Field(description="each model's state: loading, ready or failed")
    execution_providers: dict[str, dict[str, str]] = Field(
        description="per loaded model, what each graph actually runs on: ONNX Runtime's execution provider "
        "(after any fall-back), or the torch device"
    )
    batching: dict[str, float | int | None]
    limits: dict[str, int]


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
