"""The most a model's sentences/s can reach on a device: the backbone alone (transformers AutoModel,
no LoRA, no heads, no decoding), on sentences tokenised beforehand and sorted by length, so that
every batch is as short as the data allows. A served or offline figure is judged as a share of this.
Precisions: fp32; fp16 or bf16, the weights converted once, attention's kernels torch's choice;
fp16-no-cudnn-attention (or bf16-…), converted, with attention kept off cuDNN's kernels (as
`--precision` serves on CUDA); and fp16-autocast or bf16-autocast, the fp32 weights under autocast,
for comparison. Each row also times its first batch again, five times over (`repeat_batch_ms`
beside `mean_batch_ms`): a precision that pays for every new shape (torch prefers cuDNN attention
on Hopper in half precision, and cuDNN builds a plan per shape) is fast there and slow on the
length-sorted batches, whose shapes are all new.

    python benchmarks/bare_encoder.py --device cuda --data ../shared/data/conll03 --sizes 1,32,128,512
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoTokenizer

from nerserve.loadtest.client import ORDER_HELP, Order, arrange
from nerserve.ner.backbone import DEFAULT_BACKBONE, resolve_backbone
from nerserve.ner.data import read_split
from nerserve.ner.encoder import load_backbone
from nerserve.ner.torch_graph import HALF_DTYPES, SHAPE_FREE_ATTENTION

app = typer.Typer(add_completion=False)


def _batches(encoded: list[list[int]], size: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Padded id and mask tensors, already on the device: only the encoder is timed."""
    batches = []
    for start in range(0, len(encoded), size):
        rows = encoded[start : start + size]
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        batches.append((ids.to(device), mask.to(device)))
    return batches


@dataclass
class Timed:
    model: Any
    autocast: torch.dtype | None = None  # the dtype to autocast to; None: no autocast
    attention: list[SDPBackend] | None = None  # the kernels attention may use; None: torch's choice


def in_precision(model: Any, precision: str) -> Timed:
    """The model to time for PRECISION, and how."""
    name, _, mode = precision.partition("-")
    if name == "fp32":
        return Timed(model)
    if mode == "autocast":
        return Timed(model, autocast=HALF_DTYPES[name])
    converted = copy.deepcopy(model).to(HALF_DTYPES[name])
    return Timed(converted, attention=SHAPE_FREE_ATTENTION if mode == "no-cudnn-attention" else None)


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timings(timed: Timed, encoded: list[list[int]], size: int, device: torch.device) -> dict[str, float]:
    """sentences/s at batch SIZE, the mean batch's ms, and the first batch's ms when run again."""
    batches = _batches(encoded, size, device)
    model, dtype = timed.model, timed.autocast
    attention = sdpa_kernel(timed.attention) if timed.attention else contextlib.nullcontext()
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None), attention:
        model(input_ids=batches[0][0], attention_mask=batches[0][1])  # warm-up (kernels, allocator)
        _wait(device)
        started = time.perf_counter()
        for ids, mask in batches:
            model(input_ids=ids, attention_mask=mask)
        _wait(device)
        elapsed = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(5):
            model(input_ids=batches[0][0], attention_mask=batches[0][1])
        _wait(device)
        repeated = (time.perf_counter() - started) / 5
    return {
        "sentences_per_second": round(len(encoded) / elapsed, 1),
        "mean_batch_ms": round(1000 * elapsed / len(batches), 3),
        "repeat_batch_ms": round(1000 * repeated, 3),
    }


@app.command()
def main(
    data: Annotated[Path, typer.Option(help="dataset folder (its test split)")] = Path("../shared/data/conll03"),
    backbone: Annotated[str, typer.Option(help="package name or local HF folder")] = DEFAULT_BACKBONE,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cuda",
    sizes: Annotated[str, typer.Option(help="comma-separated batch sizes")] = "1,32,128,512",
    precisions: Annotated[
        str, typer.Option(help="fp32, fp16, bf16, fp16-autocast, fp16-no-cudnn-attention, … (comma-separated)")
    ] = "fp32,fp16,fp16-autocast",
    limit: Annotated[int, typer.Option(min=32, help="test sentences (batch 1 runs at most 512 of them)")] = 3453,
    order: Annotated[Order, typer.Option(help=ORDER_HELP)] = Order.SHUFFLED,
) -> None:
    info = resolve_backbone(backbone)
    torch_device = torch.device(device)
    model: Any = load_backbone(info)
    model.to(torch_device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(info.path))
    words = arrange([list(s.tokens) for s in read_split(data, "test")], order)[:limit]
    encoded = sorted(tokenizer(words, is_split_into_words=True, truncation=True, max_length=512)["input_ids"], key=len)
    rows: list[dict[str, Any]] = []
    for precision in precisions.split(","):
        timed = in_precision(model, precision)  # converted once for all its batch sizes
        for size in (int(n) for n in sizes.split(",")):
            subset = encoded[:: max(1, len(encoded) // 512)] if size == 1 else encoded
            rows.append({"precision": precision, "batch_size": size, **timings(timed, subset, size, torch_device)})
            typer.echo(json.dumps(rows[-1]), err=True)
    result = {
        "backbone": info.name,
        "device": torch.cuda.get_device_name() if torch_device.type == "cuda" else "cpu",
        "sentences": len(encoded),
        "order": order.value,
        "mean_subwords": round(sum(map(len, encoded)) / len(encoded), 1),
        "rows": rows,
        "best": {p: max(r["sentences_per_second"] for r in rows if r["precision"] == p) for p in precisions.split(",")},
    }
    typer.echo(json.dumps(result))


if __name__ == "__main__":
    app()
