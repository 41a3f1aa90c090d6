"""Imports only go downward (design notes): the service never imports training or export code,
the load tester imports nothing of the project, and model code never imports the service."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(package: str, top_level_only: bool = False) -> dict[str, set[str]]:
    """Imported module names per file; `top_level_only` skips imports inside functions (lazy ones)."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in tree.body if top_level_only else ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, forbidden: tuple[str, ...], allowed_files: tuple[str, ...] = ()) -> list[str]:
    return [
        f"{file} imports {name}"
        for file, names in imports(package).items()
        if file not in allowed_files
        for name in names
        if name.startswith(forbidden)
    ]


def test_service_never_imports_training_or_export() -> None:
    assert (
        offenders(
            "service",
            (
                "export",
                "ner.training",
                "ner.archs.span.loss",
                "ner.archs.nag.loss",
                "ner.archs.diffusion.loss",
                "ner.data",
            ),
        )
        == []
    )


def test_loadtest_speaks_http_only() -> None:
    assert offenders("loadtest", ("ner", "service", "export")) == []


def test_model_code_never_imports_service_or_export() -> None:
    # ner/cli.py is the composition root: it starts the stages (lazily, per command).
    assert offenders("ner", ("service", "export", "loadtest"), allowed_files=("ner/cli.py",)) == []


def test_numpy_layers_stay_free_of_torch() -> None:
    """At import time; a lazy import inside a rarely used function (an old tokenizer format) is allowed."""
    torch_free = (
        "ner/types.py",
        "ner/graph.py",
        "ner/signatures.py",
        "ner/model_store.py",
        "ner/text/",
        "ner/archs/registry.py",
        "ner/archs/feeds.py",
        "ner/archs/config_io.py",
        "ner/archs/span/config.py",
        "ner/archs/span/program.py",
        "ner/archs/span/decode.py",
        "ner/archs/nag/config.py",
        "ner/archs/nag/program.py",
        "ner/archs/nag/decode.py",
        "ner/archs/nag/targets.py",
        "ner/archs/diffusion/config.py",
        "ner/archs/diffusion/schedule.py",
        "ner/archs/diffusion/program.py",
        "ner/archs/diffusion/decode.py",
        "service/pipeline.py",
        "service/batching/",
        "service/api/",
    )
    bad = [
        f"{file} imports {name}"
        for package in ("ner", "service")
        for file, names in imports(package, top_level_only=True).items()
        if file.startswith(torch_free)
        for name in names
        if name.split(".")[0] in ("torch", "transformers", "peft")
    ]
    assert bad == []
