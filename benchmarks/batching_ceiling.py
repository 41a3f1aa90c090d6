"""What batching can gain on this machine, offline: sentences/s of a model's exported graphs
(tokenise → graphs → decode, no HTTP) at batch sizes 1..32, with sentences in arrival order (as
a server receives them) and length-sorted (the best a batcher could pack).

    python benchmarks/batching_ceiling.py --model span-conll03 --data ../shared/data/conll03 --json
    python benchmarks/batching_ceiling.py --model setgen-conll03 --runtime eager --device cuda --sizes 1,8,32,128
    python benchmarks/batching_ceiling.py --runtime eager --device cuda --sizes 128,256,512 --lanes 2

With `--as-on-a-device` (the eager runtime on the CPU) each batch runs whole, as on a GPU, where the
CPU would run it in groups of similar lengths: what a device pays for a batch of mixed lengths,
measured without one; `--entities FILE` writes every sentence's entity set at the first batch size,
so that two trees' outputs can be compared sentence by sentence.

With `--lanes 2` two batches are in flight at once, each predicted from a thread of its own (on
CUDA, each launching on a stream of its own), as the service's graph lanes run them: one batch's
tokenising, preparing and decoding overlap the other's device pass. One lane is one batch at a
time, host and device in turn.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.loadtest.client import ORDER_HELP, Order, arrange
from nerserve.ner.data import read_split
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime import lane_stream
from nerserve.ner.runtime.graph_set import load_graph_set

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

app = typer.Typer(add_completion=False)


def load_program(
    model: str,
    runtime: str,
    device: str,
    threads: int | None,
    precision: str = "fp32",
    int8: bool = False,
    cuda_graphs: bool = False,
    traced_heads: bool = False,
    compiled_heads: bool = False,
) -> Any:
    """The program as serve loads it: eager (merged; the backbone replayed from CUDA graphs, all but
    it traced, where asked) or an exported graph set. Module-level: a graph process's child calls it."""
    if runtime == "eager":  # torch modules on the device (CUDA figures without an exported graph)
        from nerserve.ner.loading import load_model

        folder = LOCATIONS.model_dir(model)
        return load_model(
            folder,
            device,
            precision=precision,
            merged=True,
            cuda_graphs=cuda_graphs,
            traced_heads=traced_heads,
            compiled_heads=compiled_heads,
        ).program
    return load_graph_set(LOCATIONS.graph_set_folder(model, runtime, int8), device, threads).program


def gpu_memory_mib(device: str) -> float | None:
    """Peak memory torch allocated on the GPU (eager and TorchScript; ONNX Runtime's is its own)."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.max_memory_allocated() / 2**20


def sentences_per_second(
    program: Any,
    sentences: list[list[str]],
    batch_size: int,
    options: Any = None,
    lanes: int = 1,
    setup: Callable[[], None] | None = None,
) -> float:
    batches = [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]

    def predict(batch: list[list[str]]) -> Any:
        return program.predict(batch, options)

    if lanes == 1:
        predict(batches[0])  # warm-up
        started = time.perf_counter()
        for batch in batches:
            predict(batch)
        return len(sentences) / (time.perf_counter() - started)
    with ThreadPoolExecutor(lanes, initializer=setup) as pool:
        list(pool.map(predict, batches[:lanes]))  # warm-up, the lanes' too
        started = time.perf_counter()
        list(pool.map(predict, batches))
        return len(sentences) / (time.perf_counter() - started)


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    runtime: Annotated[str, typer.Option(help="onnx, torchscript or eager")] = "onnx",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    sizes: Annotated[str, typer.Option(help="comma-separated batch sizes")] = "1,2,4,8,16,32",
    limit: Annotated[int, typer.Option(min=32)] = 1000,
    threads: Annotated[int | None, typer.Option(min=1)] = None,
    precision: Annotated[str, typer.Option(help="eager runtime: fp32, or fp16/bf16 (weights converted at load)")] = "fp32",
    options: Annotated[str, typer.Option(help="decoding options over the manifest's, as JSON: '{\"steps\": 1}'")] = "",
    int8: Annotated[bool, typer.Option("--int8", help="the ONNX export with INT8 weights (`nerserve export --int8`)")] = False,
    lanes: Annotated[int, typer.Option(min=1, help="batches in flight at once, each from a thread of its own")] = 1,
    cuda_graphs: Annotated[
        bool, typer.Option("--cuda-graphs", help="eager on CUDA: the backbone replayed from CUDA graphs (as serve's)")
    ] = False,
    compiled_heads: Annotated[
        bool, typer.Option("--compiled-heads", help="eager: all but the backbone and the BiLSTM compiled (as serve's)")
    ] = False,
    order: Annotated[Order, typer.Option(help=ORDER_HELP)] = Order.SHUFFLED,
    as_on_a_device: Annotated[
        bool, typer.Option("--as-on-a-device", help="on the CPU, each batch whole, as a GPU runs it (no length groups)")
    ] = False,
    entities: Annotated[Path | None, typer.Option(help="write each sentence's entity set here (first size)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    program = load_program(model, runtime, device, threads, precision, int8, cuda_graphs, compiled_heads=compiled_heads)
    if as_on_a_device:
        for graph in program.graphs.values():
            graph.device_resident = True
    chosen = dataclasses.replace(program.config.decode, **json.loads(options)) if options else None
    arrival = arrange([list(s.tokens) for s in read_split(data, "test")], order)[:limit]
    by_length = sorted(arrival, key=len)
    setup = lane_stream(runtime, device)  # as the service's lanes
    if entities is not None:
        first = int(sizes.split(",")[0])
        found = [program.predict(arrival[i : i + first], chosen) for i in range(0, len(arrival), first)]
        entities.write_text(json.dumps([sorted(map(str, s.keys())) for batch in found for s in batch]) + "\n")
    rows = []
    for size in (int(n) for n in sizes.split(",")):
        rows.append(
            {
                "batch_size": size,
                "arrival_order": sentences_per_second(program, arrival, size, chosen, lanes, setup),
                "length_sorted": sentences_per_second(program, by_length, size, chosen, lanes, setup),
            }
        )
    base = rows[0]["arrival_order"]
    result = {
        "model": model,
        "runtime": runtime,
        "device": device,
        "sentences": len(arrival),
        "order": order.value,
        "threads": threads,
        "precision": precision,
        "int8": int8,
        "lanes": lanes,
        "cuda_graphs": cuda_graphs,
        "compiled_heads": compiled_heads,
        "as_on_a_device": as_on_a_device,
        "options": json.loads(options) if options else {},
        "rows": rows,
        "best_gain_over_batch_1": max(max(r["arrival_order"], r["length_sorted"]) for r in rows) / base,
        "gpu_memory_mib": gpu_memory_mib(device),
    }
    if as_json:
        typer.echo(json.dumps(result))
        return
    for row in rows:
        typer.echo(
            f"batch {row['batch_size']:>2}: {row['arrival_order']:7.1f} (arrival order)  {row['length_sorted']:7.1f} (sorted)"
        )
    typer.echo(f"best gain over batch 1: {result['best_gain_over_batch_1']:.2f}x")


if __name__ == "__main__":
    app()
