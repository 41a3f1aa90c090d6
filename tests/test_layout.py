"""The package tree is the import graph: every module lives in the folder its import name says, so a
tool that reads the folders (grimp, pydeps) sees the layers the import-linter contracts keep."""

from __future__ import annotations

import os
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parent.parent / "nerserve"
LAYERS = ("ner", "service", "export", "loadtest")


def test_no_link_inside_the_package() -> None:
    entries = [Path(root, name) for root, folders, files in os.walk(PACKAGE) for name in folders + files]
    assert [str(entry) for entry in entries if entry.is_symlink()] == []


def test_every_module_file_is_where_its_name_says() -> None:
    graph = grimp.build_graph("nerserve", cache_dir=None)
    modules = graph.modules
    assert {f"nerserve.{layer}" for layer in LAYERS} <= modules
    for module in ("nerserve.service.main", "nerserve.export.build", "nerserve.ner.archs.gliner.program"):
        assert module in modules
        relative = Path(*module.split(".")[1:])
        path = PACKAGE / relative.with_suffix(".py")
        assert path.is_file() and path.resolve() == path, module


def test_the_layers_as_the_folders_show_them() -> None:
    graph = grimp.build_graph("nerserve", cache_dir=None)
    assert graph.find_shortest_chain("nerserve.service.main", "nerserve.ner.types") is not None
    assert graph.find_shortest_chain("nerserve.export.build", "nerserve.ner.runtime.graph_set") is not None
    for upper, lower in (("nerserve.export", "nerserve.service"), ("nerserve.service", "nerserve.export")):
        assert not graph.chain_exists(upper, lower, as_packages=True), f"{upper} reaches {lower}"


def test_only_the_composition_root_reads_the_environment_or_its_own_file() -> None:
    """Folders and settings are made by the command line and passed down (docs/design.md)."""
    readers = []
    for layer in ("ner", "service", "export"):
        for path in (PACKAGE / layer).rglob("*.py"):
            text = path.read_text()
            readers += [f"{path}: {word}" for word in ("os.environ", "os.getenv", "__file__") if word in text]
    assert readers == []
