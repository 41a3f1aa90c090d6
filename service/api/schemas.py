"""Every API shape (pydantic v2), with the examples the OpenAPI docs show."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ExtractRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "span-conll03", "texts": ["EU rejects German call to boycott British lamb."]},
                {"model": "span-genia", "tokens": [["IL-2", "gene", "expression", "requires", "NF-kappa", "B"]]},
            ]
        },
    )

    model: str | None = Field(None, description="model name (GET /models); the server default when absent")
    texts: list[str] | None = Field(None, description="raw texts of any length: split into sentences, windowed")
    tokens: list[list[str]] | None = Field(None, description="pre-tokenised sentences (lists of words)")
    labels: list[str] | None = Field(None, description="entity types, for open-label models only")
    options: dict[str, Any] = Field(default_factory=dict, description="the architecture's per-request options")
    deadline_ms: float | None = Field(None, gt=0, description="answer 504 if not started within this time")

    @model_validator(mode="after")
    def exactly_one_input(self) -> ExtractRequest:
        if (self.texts is None) == (self.tokens is None):
            raise ValueError("give exactly one of 'texts' or 'tokens'")
        return self


class EntityOut(BaseModel):
    type: str
    text: str = Field(description="the fragments' surfaces joined by one space")
    score: float
    spans: list[tuple[int, int]] = Field(description="character offsets [start, end) per fragment (code points)")
    token_spans: list[tuple[int, int]] = Field(description="word offsets [start, end) per fragment")


class ResultOut(BaseModel):
    entities: list[EntityOut]


class ExtractResponse(BaseModel):
    model: str
    version: str
    results: list[ResultOut]


class ModelInfo(BaseModel):
    name: str
    architecture: str
    version: str
    labels: list[str]
    capabilities: dict[str, bool]
    options: dict[str, Any] = Field(description="per-request options with their defaults")
    runtime: str
    scores: dict[str, Any]


class ModelsResponse(BaseModel):
    default: str | None
    models: list[ModelInfo]


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
