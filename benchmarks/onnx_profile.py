"""Where a batch's time goes in ONNX Runtime on its device, from ONNX Runtime's own profiler: the
path the GPU image serves (`--runtime onnx --device cuda`). For each batch size and graph: a run's
time and how much of it its nodes account for, the nodes each execution provider ran (on CUDA the
provider places shape arithmetic, and any operator it has no kernel for, on the CPU), the copies it
inserts between host and device (a host-bound copy waits for the device's queue: a
synchronisation), and the operators by time, per batch. On CUDA a node's time is the host's time in
it, its kernels launched rather than run (ONNX Runtime's release builds record no device events), so
a batch's time beside its nodes' says how much of it is launching and how much waiting (copies,
synchronisations, allocation). The profiler costs each node a few µs of its own: a batch's time is
taken without it first (`wall_ms_per_batch`), then with it (`profiled_wall_ms_per_batch`).

    python benchmarks/onnx_profile.py --model span-conll03 --device cuda --sizes 1,128
    python benchmarks/onnx_profile.py --model span-conll03 --device cpu --sizes 1,32   # a dry run
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Annotated, Any

import onnxruntime as ort
import typer

from nerserve.loadtest.client import Order, arrange
from nerserve.ner.data import read_split
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.ner.runtime.onnx import OnnxGraph, session_options

LOCATIONS = Locations()
COPIES = ("MemcpyToHost", "MemcpyFromHost")
TOP_OPERATORS = 12

app = typer.Typer(add_completion=False)


def profiled(graph: OnnxGraph, folder: Path) -> ort.InferenceSession:
    """The graph's session again, as serve makes it on the same providers, with ONNX Runtime's
    profiler on (it profiles a session from its start): it replaces the graph's own."""
    options = session_options(graph.optimization_level, graph.threads)
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / graph.path.stem)
    providers = graph.session.get_providers()
    provider_options = graph.session.get_provider_options()
    session = ort.InferenceSession(
        str(graph.path), options, providers=providers, provider_options=[provider_options[p] for p in providers]
    )
    graph.session = session
    return session


def graph_report(events: list[dict[str, Any]], window: tuple[float, float], batches: int) -> dict[str, Any]:
    """One graph's runs for `batches` batches (its events within `window`, µs from the profile's
    start), per batch, in ms. A GPU runs each graph once a batch; the CPU once a group of sentences
    of similar lengths (`runs_per_batch`)."""
    events = [e for e in events if window[0] <= e.get("ts", -1) < window[1]]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    run_us = [e["dur"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    names_by_provider: dict[str, set[str]] = defaultdict(set)
    by_operator: Counter[tuple[str, str]] = Counter()  # (provider, operator) → µs
    calls: Counter[tuple[str, str]] = Counter()
    provider_us: Counter[str] = Counter()
    for event in nodes:
        provider, operator = event["args"].get("provider", "?"), event["args"].get("op_name", "?")
        names_by_provider[provider].add(event["name"])
        provider_us[provider] += event["dur"]
        by_operator[provider, operator] += event["dur"]
        calls[provider, operator] += 1

    def share(key: tuple[str, str]) -> dict[str, float]:
        """A (provider, operator)'s nodes a batch and their ms."""
        return {"per_batch": calls[key] / batches, "ms": by_operator[key] / 1000 / batches}

    node_ms = sum(e["dur"] for e in nodes) / 1000 / batches
    run_ms = sum(run_us) / 1000 / batches
    return {
        "runs_per_batch": len(run_us) / batches,
        "run_ms": run_ms,
        "node_ms": node_ms,
        "outside_nodes_ms": run_ms - node_ms,
        "by_provider": {
            provider: {"nodes": len(names), "ms": provider_us[provider] / 1000 / batches}
            for provider, names in names_by_provider.items()
        },
        "copies": {f"{key[1]} on {key[0]}": share(key) for key in by_operator if key[1] in COPIES},
        "operators": [
            {"operator": key[1], "provider": key[0], **share(key)} for key, _ in by_operator.most_common(TOP_OPERATORS)
        ],
    }


def profile_clock(sessions: dict[str, ort.InferenceSession]) -> dict[str, float]:
    """Now, on each session's profile clock (µs from its start, which ONNX Runtime gives on the wall
    clock)."""
    now = time.time_ns()
    return {name: (now - session.get_profiling_start_time_ns()) / 1000 for name, session in sessions.items()}


def measure(program: Any, batch: list[list[str]], repeats: int) -> float:
    """ms a batch (tokenise → graphs → decode), the median of `repeats`."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        program.predict(batch)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cuda",
    sizes: Annotated[str, typer.Option(help="comma-separated batch sizes")] = "1,128",
    repeats: Annotated[int, typer.Option(min=1)] = 10,
    threads: Annotated[int | None, typer.Option(min=1)] = None,
    padded_backbone: Annotated[
        bool,
        typer.Option("--padded-backbone", help="the export whose backbone runs its padding too (export --padded-backbone)"),
    ] = False,
) -> None:
    loaded = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx", padded=padded_backbone), device, threads)
    program = loaded.program
    graphs: dict[str, OnnxGraph] = program.graphs
    sentences = arrange([list(s.tokens) for s in read_split(data, "test")], Order.SHUFFLED)
    batches = [sentences[:size] for size in (int(n) for n in sizes.split(","))]
    # first without the profiler, whose own cost a node (a few µs) a pass of hundreds of small nodes feels
    rows: list[dict[str, Any]] = []
    for batch in batches:
        for _ in range(3):  # first runs of a shape (allocation, kernels chosen) are not what a server pays
            program.predict(batch)
        rows.append({"batch_size": len(batch), "wall_ms_per_batch": measure(program, batch, repeats)})
    with tempfile.TemporaryDirectory() as folder:
        sessions = {name: profiled(graph, Path(folder)) for name, graph in graphs.items()}
        windows: list[dict[str, tuple[float, float]]] = []
        for row, batch in zip(rows, batches, strict=True):
            program.predict(batch)  # the new sessions' first run of the shape
            since = profile_clock(sessions)
            row["profiled_wall_ms_per_batch"] = measure(program, batch, repeats)
            windows.append({name: (since[name], until) for name, until in profile_clock(sessions).items()})
        files = {name: session.end_profiling() for name, session in sessions.items()}
        events = {name: json.loads(Path(file).read_text()) for name, file in files.items()}
    for row, window in zip(rows, windows, strict=True):
        row["graphs"] = {name: graph_report(events[name], window[name], repeats) for name in graphs}
    report = {
        "model": model,
        "device": device,
        "backbone_on_real_subwords_only": loaded.export.get("backbone_on_real_subwords_only", False),
        "onnxruntime": ort.__version__,
        "providers": {name: graph.session.get_providers() for name, graph in graphs.items()},
        "repeats": repeats,
        "sizes": rows,
    }
    typer.echo(json.dumps(report))


if __name__ == "__main__":
    app()
