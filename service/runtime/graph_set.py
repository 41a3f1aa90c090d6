"""An exported graph set on disk (graphs + tokenizer + manifest + export.json) → a runnable program."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ner.archs.registry import architecture
from ner.graph import GraphError
from ner.model_store import Manifest, read_manifest
from ner.text.subword import SubwordEncoder, load_tokenizer
from service.runtime import GRAPH_SUFFIX, RuntimeName, load_graph

EXPORT_JSON = "export.json"


@dataclass
class LoadedGraphSet:
    folder: Path
    manifest: Manifest
    export: dict[str, Any]
    program: Any


def load_graph_set(folder: Path, device: str = "cpu", threads: int | None = None) -> LoadedGraphSet:
    """Load a ready export; refuses one whose parity check failed or whose files are missing."""
    info_path = folder / EXPORT_JSON
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GraphError(f"{info_path}: missing (not an export folder)") from None
    except json.JSONDecodeError as error:
        raise GraphError(f"{info_path}: invalid JSON ({error.msg})") from None
    if not info.get("ready"):
        raise GraphError(f"{info_path}: export is not marked ready (parity failed or incomplete)")
    manifest = read_manifest(folder)
    spec = architecture(manifest.architecture)
    runtime = RuntimeName(info["format"])
    graphs = {name: load_graph(folder / f"{name}{GRAPH_SUFFIX[runtime]}", runtime, device, threads) for name in spec.graphs}
    subwords = SubwordEncoder(load_tokenizer(folder))
    return LoadedGraphSet(folder, manifest, info, spec.build_program(graphs, manifest.config, subwords))
