"""The model store: one folder per trained model, `manifest.json` + `weights.safetensors`.

The manifest is the single description of a model: which architecture, which labels, which
backbone it adapts, its hyper-parameters and decoding settings, and the scores it earned.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


class ModelStoreError(ValueError):
    pass


def model_store_root() -> Path:
    """NERSERVE_MODEL_STORE (`--model-store` sets it), else the checkout's model_store/ when running
    from a source checkout, else ./model_store. Read at each call, so the flag applies to a
    process's modules whenever they were imported, and to the export subprocess it starts."""
    configured = os.environ.get("NERSERVE_MODEL_STORE")
    if configured:
        return Path(configured)
    checkout = Path(__file__).resolve().parent.parent / "model_store"
    return checkout if checkout.is_dir() else Path.cwd() / "model_store"


def graph_cache_root() -> Path:
    """Where exported graph sets are cached: NERSERVE_GRAPH_CACHE (`--graph-cache`; NERSERVE_BUILD_DIR
    is its older name), else build/graphs beside the model store."""
    configured = os.environ.get("NERSERVE_GRAPH_CACHE") or os.environ.get("NERSERVE_BUILD_DIR")
    return Path(configured) if configured else model_store_root().parent / "build" / "graphs"


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


def model_dir(name_or_path: str, store: Path | None = None) -> Path:
    """A model folder by name under the store, or by path."""
    store = store or model_store_root()
    candidate = Path(name_or_path)
    if (candidate / MANIFEST).is_file():
        return candidate
    if (store / name_or_path / MANIFEST).is_file():
        return store / name_or_path
    known = ", ".join(list_models(store)) or "none"
    raise ModelStoreError(f"unknown model {name_or_path!r}: not a model folder; models in {store}: {known}")


def list_models(store: Path | None = None) -> list[str]:
    store = store or model_store_root()
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
# 3: encoders take packed rows)
EXPORT_VERSION = "3"


def source_digest(folder: Path, fmt: str, int8: bool = False) -> str:
    digest = hashlib.sha256()
    for part in (EXPORT_VERSION, fmt, "int8-encoder" if int8 else "fp32"):
        digest.update(part.encode() + b"\0")
    for name in (MANIFEST, WEIGHTS):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()


def graph_set_folder(name_or_path: str, fmt: str, int8: bool = False, build_dir: Path | None = None) -> Path:
    """Where the export of a model in a format lives (whether or not it exists yet)."""
    folder = model_dir(name_or_path)
    tag = f"{fmt}-int8" if int8 else fmt
    return (build_dir or graph_cache_root()) / folder.name / f"{tag}-{source_digest(folder, fmt, int8)[:16]}"
