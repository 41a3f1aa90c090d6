"""What feeding one batch's graphs costs the thread that launches them, as the eager runtime feeds
them on a GPU: the host arrays packed by dtype and uploaded (`torch_graph.upload_host_values`),
then each feed as its graph takes it (`torch_graph.as_fed`). Followed on the CPU (no pinning, the
CPU as the device), for span's two graphs at one batch: the calls into torch it makes (each lets
the interpreter lock go, and beside a busy thread must wait to get it back), and its median time
alone and beside a thread running Python at the server's switch interval.

    python benchmarks/feed_calls.py --model span-conll03 --data ../shared/data/conll03 --batch-size 64
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from pass_anatomy import beside, median_ms, python_only

from nerserve.ner.data import read_split
from nerserve.ner.graph import Value
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import Locations
from nerserve.ner.torch_graph import as_fed, upload_host_values
from nerserve.service.interpreter import DEFAULT_SWITCH_MS, hand_over_quickly

LOCATIONS = Locations()
CPU = torch.device("cpu")
app = typer.Typer(add_completion=False)


def feed(values: Sequence[Value]) -> list[torch.Tensor]:
    return [as_fed(tensor, CPU, None) for tensor in upload_host_values(values, CPU, pin=False)]


def torch_calls(run: Callable[[], Any]) -> Counter[str]:
    """The calls into torch's C functions RUN makes, by name."""
    calls: Counter[str] = Counter()

    def note(frame: Any, event: str, function: Any) -> None:
        if event == "c_call" and _is_torch(function):
            calls[function.__qualname__] += 1

    sys.setprofile(note)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def _is_torch(function: Any) -> bool:
    owner = getattr(function, "__self__", None)
    return "torch" in (getattr(function, "__module__", None) or "") or isinstance(owner, torch.Tensor)


def beside_python(run: Callable[[], Any], repeats: int) -> float:
    """RUN's median ms while another thread runs Python without pause, at the server's switch interval."""
    hand_over_quickly()
    with beside(python_only):
        return median_ms(lambda _: run(), [None] * repeats)


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    batch_size: Annotated[int, typer.Option(min=1)] = 64,
    repeats: Annotated[int, typer.Option(min=1)] = 30,
) -> None:
    program = load_model(LOCATIONS.model_dir(model), "cpu", merged=True).program
    sentences = [list(s.tokens) for s in read_split(data, "test", batch_size)]
    batch = program.prepare(sentences)
    encoder, proposal = program.graphs["encoder"], program.graphs["span_proposal"]
    encoded = encoder.run(batch.encoder_inputs)
    # the encoder's outputs stay on the device for the proposal, as tensors
    kept = {name: torch.from_numpy(encoded[name]) for name in ("word_states", "context")}
    feeds = program.span_inputs(batch, kept, None)
    groups = [[batch.encoder_inputs[name] for name in encoder.input_names], [feeds[name] for name in proposal.input_names]]

    def run() -> None:
        for values in groups:
            feed(values)

    run()  # dtypes looked up once
    calls = torch_calls(run)
    report = {
        "model": model,
        "batch_size": batch_size,
        "feeds": [len(values) for values in groups],
        "torch_calls": sum(calls.values()),
        "torch_calls_by_name": dict(calls.most_common()),
        "alone_ms": median_ms(lambda _: run(), [None] * repeats * 10),
        "beside_python_ms": beside_python(run, repeats),
        "switch_ms": DEFAULT_SWITCH_MS,
    }
    typer.echo(json.dumps(report, indent=2))


if __name__ == "__main__":
    app()
