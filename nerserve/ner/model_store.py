"""The model store: one folder per trained model, `manifest.json` + `weights.safetensors`.

The manifest is the single description of a model: which architecture, which labels, which
backbone it adapts, its hyper-parameters and decoding settings, and the scores it earned.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from nerserve.ner.text.segment import PLAIN_WORDS, WordStyle

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


class ModelStoreError(ValueError):
    pass


class Locations(BaseSettings):
    """Where the models, their exported graphs and the datasets live. Made once, by the composition
    root (the command line, from its flags and NERSERVE_* variables), and passed down: nothing below
    it reads the environment or derives a path from its own file. Relative paths are taken from the
    working directory when the settings are made, so that a child process (start-up export, a Ray
    replica) sees the same folders."""

    model_config = SettingsConfigDict(env_prefix="NERSERVE_", extra="ignore")

    model_store: Path = Field(Path("model_store"), description="folder of model folders (manifest.json + weights)")
    graph_cache: Path = Field(Path("build/graphs"), description="where exported graph sets are cached (build output)")
    data_root: Path = Field(
        Path("../shared/data"), description="folder of the dataset folders (the sentences export checks parity on)"
    )

    @field_validator("model_store", "graph_cache", "data_root")
    @classmethod
    def absolute(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    def model_dir(self, name_or_path: str | Path) -> Path:
        return model_dir(str(name_or_path), self.model_store)

    def list_models(self) -> list[str]:
        return list_models(self.model_store)

    def graph_set_folder(self, name_or_path: str | Path, fmt: str, int8: bool = False, padded: bool = False) -> Path:
        return graph_set_folder(self.model_dir(name_or_path), fmt, self.graph_cache, int8, padded)


class BackboneRecord(BaseModel):
    name: str
    package: str | None
    version: str | None
    sha256: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    architecture: str
    version: str
    labels: list[str]
    backbone: BackboneRecord
    config: dict[str, Any]  # the architecture's own config (network + decoding)
    lora: dict[str, Any]
    data: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    scores: dict[str, Any] = Field(default_factory=dict)
    words: WordStyle = PLAIN_WORDS  # how its training data writes what corpora write differently


def model_dir(name_or_path: str, store: Path) -> Path:
    """A model folder by name under the store, or by path."""
    candidate = Path(name_or_path)
    if (candidate / MANIFEST).is_file():
        return candidate
    if (store / name_or_path / MANIFEST).is_file():
        return store / name_or_path
    known = ", ".join(list_models(store)) or "none"
    raise ModelStoreError(f"unknown model {name_or_path!r}: not a model folder; models in {store}: {known}")


def list_models(store: Path) -> list[str]:
    if not store.is_dir():
        return []
    return sorted(p.name for p in store.iterdir() if (p / MANIFEST).is_file())


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        return Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ModelStoreError(f"{path}: missing manifest") from None
    except (json.JSONDecodeError, ValidationError) as error:
        first = str(error).splitlines()[0]
        raise ModelStoreError(f"{path}: invalid manifest ({first})") from None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_version(weights: Path) -> str:
    """A model's version: the day its weights were written and their digest, so two models written on
    one day never share a version (`/models`, KServe v2)."""
    return f"{datetime.date.today().isoformat()}.{file_sha256(weights)[:8]}"


def write_manifest(folder: Path, manifest: Manifest) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")


# Exported graph sets are build output, keyed by a digest of what they were built from.
# bump when the export code changes what it writes (2: signatures from specs, stricter parity;
# 3: encoders take packed rows; 4: max pooling without a sub-word mask; 5: gner's vocabulary axis fixed;
# 6: the span proposal takes filter thresholds; 7: and answers its candidates only; 8: the pointer
# decoder's cross-attention keys and values come from the encoder graph, once per sentence; 9: gner's
# step graph reads its inputs per row, its `rows` graph selects them; 10: the label-matching graph
# scores packed spans; 11: the character CNN reads a stream of the batch's characters; 12: the span
# proposal's range-max levels come from a table, so no reduction meets an empty candidate set; 13: that
# table is a constant of the graph, not computed in it; 14: bounds read from shapes (span, gner) are
# numbers or made on the device: traced, a `clamp` took a host tensor there, which CUDA refuses; 15: the
# span proposal's filter scores the real seeds only, not the batch's padding; 16: ONNX encoders run the
# backbone's position-wise layers on real sub-words only)
EXPORT_VERSION = "16"
# INT8 exports' own version, changed when what they quantise changes (an architecture's int8_graphs)
INT8_VERSION = "int8-6"


def source_digest(folder: Path, fmt: str, int8: bool = False) -> str:
    digest = hashlib.sha256()
    for part in (EXPORT_VERSION, fmt, INT8_VERSION if int8 else "fp32"):
        digest.update(part.encode() + b"\0")
    for name in (MANIFEST, WEIGHTS):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()


def graph_set_folder(folder: Path, fmt: str, graph_cache: Path, int8: bool = False, padded: bool = False) -> Path:
    """Where the export of the model in FOLDER to a format lives (whether or not it exists yet).
    PADDED: the ONNX export whose backbone runs its rows' padding too (export_model's
    `padded_backbone`), beside the service's, which never loads it."""
    tag = fmt + ("-int8" if int8 else "") + ("-padded" if padded else "")
    return graph_cache / folder.name / f"{tag}-{source_digest(folder, fmt, int8)[:16]}"
