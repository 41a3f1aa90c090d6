"""Where one batch's time goes, offline, under torch's profiler (eager runtime): the operators by
self CPU time and by self device time, and how many host-device copies and synchronisations a
batch makes, at each batch size. It says whether a batch's fixed cost is the device's work, the
launches around it, or the host.

Every device also gets the operators a batch dispatches (`operators_per_batch`: torch's dispatcher,
views apart, since a view launches no kernel), by graph: on a GPU nearly each is a kernel launched
from Python, so this count, taken on the CPU too, is what a change to a lone sentence's launch-bound
pass can be measured by where there is no GPU.

    python benchmarks/profile_batch.py --model span-conll03 --device cuda --sizes 1,128
    python benchmarks/profile_batch.py --model span-conll03 --device cpu --sizes 1
    python benchmarks/profile_batch.py --model span-conll03 --device cpu --sizes 1,64 --as-on-a-device
    python benchmarks/profile_batch.py --model span-conll03 --device cuda --sizes 1,512 --compiled-heads

With --compiled-heads (serve's) the operators are not counted (a dispatch mode turns torch.compile's
code back into eager torch): its launches are, on a GPU (Triton's kernels are launched by
`cuLaunchKernel`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from nerserve.ner.data import read_split
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import Locations

LOCATIONS = Locations()
COPIES = (
    "aten::_to_copy",
    "aten::copy_",
    "cudaMemcpyAsync",
    "aten::item",
    "aten::_local_scalar_dense",
    "cudaStreamSynchronize",
)

app = typer.Typer(add_completion=False)


class OperatorCount(TorchDispatchMode):
    """The operators dispatched while it is on, views apart, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view:
            self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def operators_per_batch(program: Any, batch: list[list[str]]) -> dict[str, Any]:
    """One batch's dispatched operators (views apart): in all, by graph, and the most frequent."""
    by_graph: dict[str, int] = {}
    every: Counter[str] = Counter()
    for name, graph in program.graphs.items():
        run = graph.run

        def counted(inputs: Any, keep_on_device: Any = (), run: Any = run, name: str = name) -> Any:
            with OperatorCount() as count:
                outputs = run(inputs, keep_on_device)
            by_graph[name] = by_graph.get(name, 0) + sum(count.counts.values())
            every.update(count.counts)
            return outputs

        graph.run = counted
    try:
        program.predict(batch)
    finally:
        for graph in program.graphs.values():
            del graph.run  # the class's own again
    return {"total": sum(by_graph.values()), "by_graph": by_graph, "most_frequent": dict(every.most_common(12))}


def _row(event: Any, device: bool) -> dict[str, Any]:
    return {
        "name": event.key,
        "calls": event.count,
        "self_cpu_ms": round(event.self_cpu_time_total / 1000, 3),
        **({"self_device_ms": round(event.self_device_time_total / 1000, 3)} if device else {}),
    }


def profile_size(
    program: Any, sentences: list[list[str]], size: int, device: str, repeats: int, count_operators: bool = True
) -> dict[str, Any]:
    batch = sentences[:size]
    program.predict(batch)  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            program.predict(batch)
    events = prof.key_averages()
    on_device = device.startswith("cuda")
    by_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:20]
    by_device = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:20] if on_device else []
    return {
        "batch_size": size,
        "repeats": repeats,
        "cpu_ms_per_batch": round(sum(e.self_cpu_time_total for e in events) / 1000 / repeats, 3),
        # kernels and copies only: an operator's own device time is its kernels' again
        "device_ms_per_batch": round(
            sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1000 / repeats, 3
        )
        if on_device
        else None,
        "operators_per_batch": operators_per_batch(program, batch) if count_operators else None,
        "kernel_launches_per_batch": sum(
            e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
        )
        / repeats,
        "copies_and_syncs_per_batch": {e.key: e.count / repeats for e in events if e.key in COPIES},
        "top_self_cpu": [_row(e, on_device) for e in by_cpu],
        "top_self_device": [_row(e, on_device) for e in by_device],
    }


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    device: Annotated[str, typer.Option()] = "cuda",
    sizes: Annotated[str, typer.Option(help="comma-separated batch sizes")] = "1,128",
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    as_on_a_device: Annotated[
        bool,
        typer.Option(
            help="on the CPU, run a batch's graphs as a GPU does (each graph once for the whole batch, its "
            "outputs left for the next): the operators a GPU pass launches, counted without one"
        ),
    ] = False,
    compiled_heads: Annotated[
        bool, typer.Option(help="all but the backbone and the BiLSTM compiled at load, as serve's --compiled-heads")
    ] = False,
) -> None:
    program = load_model(LOCATIONS.model_dir(model), device, merged=True, compiled_heads=compiled_heads).program
    if as_on_a_device:
        for graph in program.graphs.values():
            graph.device_resident = True
    sentences = [list(s.tokens) for s in read_split(data, "test", 512)]
    report = {
        "model": model,
        "device": device,
        "compiled_heads": compiled_heads,
        "sizes": [profile_size(program, sentences, int(n), device, repeats, not compiled_heads) for n in sizes.split(",")],
    }
    typer.echo(json.dumps(report))


if __name__ == "__main__":
    app()
