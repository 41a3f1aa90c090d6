"""Why a served pass takes longer than the same pass offline: one model's graph pass (`program.run`
on a prepared batch, as a graph lane runs it) timed under the conditions a server adds, one at a
time, at each batch size:

- `repeat`: one prepared batch again and again (every shape seen before): the pass alone;
- `fresh`: batches of other sentences, each the first time (new batch, word, sub-word and seed
  counts, as nearly every served batch has): what first sight of a shape costs (kernel choices,
  the caching allocator's blocks, cuDNN's descriptors);
- `seen`: the same batches again, their shapes now seen;
- `beside_python`: `seen` while another thread runs Python without pause (the event loop at its
  busiest): what sharing the interpreter lock costs a pass that releases it at every operator
  (torch's bindings do) and must then wait to get it back;
- `beside_prepare`: `seen` while another thread prepares batches without pause (the prepare
  thread's real work: tokenising, numpy feeds);

the last two at each switch interval asked for (how soon a thread waiting for the lock asks for
it; the first, the server's: `service.interpreter`), with how fast the Python thread ran beside
the passes. Each figure is the median ms a pass, with the operators a pass dispatches (each a
release of the interpreter lock, and on a GPU a kernel launched from Python; TorchScript's are
dispatched from C++, ONNX Runtime's are not counted). On a GPU the eager model loads as serve loads
it (the backbone replayed from CUDA graphs in fp32 unless --no-cuda-graphs); --traced-heads: all
but the backbone traced to TorchScript, as serve's --traced-heads; --compiled-heads: compiled by
torch.compile, as serve's --compiled-heads (operators not counted: a dispatch mode turns
torch.compile's code back into eager torch); --graph-process: the passes run in
a child process as serve's --graph-process runs them (batches and outputs over a pipe), while the
other thread runs here, as the event loop and prepare do in the server's process (operators not
counted: they are the child's).

    python benchmarks/pass_anatomy.py --device cuda --sizes 1,16,64,128
    python benchmarks/pass_anatomy.py --device cpu --sizes 1,16 --batches 4
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from batching_ceiling import load_program
from profile_batch import OperatorCount

from nerserve.ner.data import read_split
from nerserve.service.graph_process import GraphProcess
from nerserve.service.interpreter import DEFAULT_SWITCH_MS, hand_over_quickly

app = typer.Typer(add_completion=False)


def median_ms(run: Callable[[Any], Any], batches: list[Any]) -> float:
    times = []
    for batch in batches:
        started = time.perf_counter()
        run(batch)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


@contextmanager
def beside(work: Callable[[], None]) -> Iterator[dict[str, int]]:
    """WORK called again and again on another thread while the block runs → how many times."""
    stop = threading.Event()
    done = {"calls": 0}

    def loop() -> None:
        while not stop.is_set():
            work()
            done["calls"] += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join()


def python_only() -> None:
    """About a millisecond of pure Python that never releases the lock of its own accord."""
    total = 0
    for value in range(20_000):
        total += value * value


def anatomy(
    program: Any,
    sentences: list[list[str]],
    size: int,
    batches: int,
    repeats: int,
    switches: list[float],
    graphs: GraphProcess | None = None,
    count_operators: bool = True,
) -> dict[str, Any]:
    chunks = [sentences[i * size : (i + 1) * size] for i in range(batches + 2)]
    prepared = [program.prepare(chunk) for chunk in chunks]
    first, others, spare = prepared[0], prepared[1:-1], chunks[-1]

    def run(batch: Any) -> Any:
        if graphs is not None:
            return graphs.run((batch, None))
        return program.run(batch)

    for _ in range(3):
        run(first)
    row: dict[str, Any] = {"batch_size": size, "batches": len(others)}
    row["repeat_ms"] = median_ms(run, [first] * repeats)
    row["fresh_ms"] = median_ms(run, others)
    row["seen_ms"] = median_ms(run, others)
    row["beside"] = [beside_others(run, others, lambda: program.prepare(spare), switch) for switch in switches]
    hand_over_quickly()
    if graphs is None and count_operators:
        with OperatorCount() as count:
            run(first)
        row["operators_per_pass"] = sum(count.counts.values())
    return row


def beside_others(
    run: Callable[[Any], Any], batches: list[Any], prepare: Callable[[], None], switch_ms: float
) -> dict[str, Any]:
    """The seen batches' passes beside a Python thread and beside a prepare thread, with a thread
    waiting for the interpreter lock asking for it after SWITCH_MS."""
    hand_over_quickly(switch_ms)
    row: dict[str, Any] = {"switch_ms": switch_ms}
    with beside(python_only) as hog:
        started = time.perf_counter()
        row["beside_python_ms"] = median_ms(run, batches)
        row["python_calls_per_second"] = round(hog["calls"] / (time.perf_counter() - started), 1)
    with beside(prepare):
        row["beside_prepare_ms"] = median_ms(run, batches)
    return row


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    device: Annotated[str, typer.Option()] = "cuda",
    runtime: Annotated[str, typer.Option(help="eager (serve's on a GPU), torchscript or onnx (exported graphs)")] = "eager",
    sizes: Annotated[str, typer.Option(help="comma-separated batch sizes")] = "1,16,64,128",
    batches: Annotated[int, typer.Option(min=1, help="fresh batches a size")] = 16,
    repeats: Annotated[int, typer.Option(min=1)] = 16,
    cuda_graphs: Annotated[bool, typer.Option(help="on CUDA in fp32: the backbone replayed, as serve's default")] = True,
    traced_heads: Annotated[bool, typer.Option(help="eager: all but the backbone traced at load, as serve's")] = False,
    compiled_heads: Annotated[
        bool, typer.Option(help="eager: all but the backbone and the BiLSTM compiled at load, as serve's")
    ] = False,
    switch_ms: Annotated[
        str, typer.Option(help="switch intervals to run the contended passes at, comma-separated (ms); the first: the server's")
    ] = f"{DEFAULT_SWITCH_MS:g},0.2,0.05",
    graph_process: Annotated[bool, typer.Option(help="the passes in a child process, as serve's --graph-process")] = False,
) -> None:
    hand_over_quickly()
    switches = [float(value) for value in switch_ms.split(",")]
    replay = cuda_graphs and device.startswith("cuda") and runtime == "eager"
    heads: dict[str, Any] = {"cuda_graphs": replay, "traced_heads": traced_heads, "compiled_heads": compiled_heads}
    graphs = None
    if graph_process:  # the passes in the child; this process prepares on the CPU, as the server's does
        load = functools.partial(load_program, model, runtime, device, 1, **heads)
        graphs = GraphProcess(model, load)
        program = load_program(model, runtime, "cpu", 1)
    else:
        program = load_program(model, runtime, device, 1, **heads)
    sentences = [list(s.tokens) for s in read_split(data, "test")]
    random.Random(0).shuffle(sentences)
    typer.echo(
        json.dumps(
            {
                "model": model,
                "device": device,
                "runtime": runtime,
                "cuda_graphs": replay,
                "traced_heads": traced_heads,
                "compiled_heads": compiled_heads,
                "graph_process": graph_process,
                "python_alone_calls_per_second": python_alone(),
                "sizes": [
                    anatomy(program, sentences, int(n), batches, repeats, switches, graphs, not compiled_heads)
                    for n in sizes.split(",")
                ],
            }
        )
    )
    if graphs is not None:
        graphs.close()


def python_alone() -> float:
    started = time.perf_counter()
    for _ in range(200):
        python_only()
    return round(200 / (time.perf_counter() - started), 1)


if __name__ == "__main__":
    app()
