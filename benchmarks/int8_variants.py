"""The span model's encoder as fp32, dynamic INT8 (what `nerserve export --int8` writes, which
quantises the span-proposal graph too) and static INT8 (QDQ, calibrated on training sentences,
per-channel weights; the proposal graph left fp32), each variant's strict F1 and words/s on the
CoNLL-2003 test split in one run, batches of 32 as in cpu_peer.py.

    python benchmarks/int8_variants.py --model span-conll03 --data ../shared/data/conll03 [--json]

Static quantisation is measured here rather than offered by the export: on the machines we have
it was no faster than dynamic, and lost more F1 (docs/reference-run/int8-variants.json). The
encoder's linear layers are Gemm nodes and its attention products MatMuls, all quantised; ONNX
shape inference cannot type the outputs of the fused operators (BiasGelu), which the quantiser
needs to scale the products after them, so those outputs are declared float first.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from nerserve.ner.data import read_split
from nerserve.ner.graph_format import EXPORT_JSON, GraphFormat, graph_file
from nerserve.ner.model_store import Locations
from nerserve.ner.runner import score
from nerserve.ner.runtime.graph_set import load_graph_set

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()


def encoder_file(folder: Path) -> Path:
    return graph_file(folder, "encoder", GraphFormat.onnx)


class EncoderBatches(CalibrationDataReader):
    """The encoder's inputs for calibration sentences, 32 at a time, as the service prepares them
    (those the graph takes: a trace leaves out an input it does not read)."""

    def __init__(self, program: Any, sentences: list[list[str]], batch_size: int = 32) -> None:
        taken = program.graphs["encoder"].input_names
        self.batches = iter(
            {
                name: value
                for name, value in program.prepare(sentences[i : i + batch_size]).encoder_inputs.items()
                if name in taken
            }
            for i in range(0, len(sentences), batch_size)
        )

    def get_next(self) -> dict[str, Any] | None:
        return next(self.batches, None)


def typed_as_float(source: Path, target: Path) -> None:
    """The graph with every node output that shape inference leaves untyped declared float (the
    fused operators' outputs: all float in this encoder), so the quantiser can see every MatMul's
    input."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(source)))
    graph = model.graph
    known = {v.name for v in [*graph.value_info, *graph.input, *graph.output]}
    untyped = [out for node in graph.node for out in node.output if out and out not in known]
    graph.value_info.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in untyped)
    onnx.save(model, str(target))


def static_variant(fp32: Path, target: Path, program: Any, calibration: list[list[str]]) -> None:
    """A copy of the fp32 graph set whose encoder is static QDQ INT8."""
    shutil.copytree(fp32, target)
    quantised = encoder_file(target)
    source = quantised.with_suffix(".fp32.onnx")
    typed_as_float(encoder_file(fp32), source)
    quantize_static(
        str(source),
        str(quantised),
        EncoderBatches(program, calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Gemm"],
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    source.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="span-conll03")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/conll03"))
    parser.add_argument("--calibration", type=int, default=256, help="training sentences to calibrate on")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folders = {
        "fp32": LOCATIONS.graph_set_folder(args.model, "onnx"),
        "dynamic": LOCATIONS.graph_set_folder(args.model, "onnx", True),
    }
    for label, folder in folders.items():
        if not (folder / EXPORT_JSON).is_file():
            raise SystemExit(
                f"export first: nerserve export {args.model} --format onnx{' --int8' if label == 'dynamic' else ''}"
            )
    train = read_split(args.data, "train")
    random.Random(0).shuffle(train)
    calibration = [list(s.tokens) for s in train[: args.calibration]]
    test = read_split(args.data, "test")
    results: dict[str, Any] = {"model": args.model, "calibration_sentences": len(calibration), "variants": {}}
    with tempfile.TemporaryDirectory() as scratch:
        program = load_graph_set(folders["fp32"]).program
        folders["static"] = Path(scratch) / "static"
        static_variant(folders["fp32"], folders["static"], program, calibration)
        for label, folder in folders.items():
            variant = load_graph_set(folder, threads=args.threads).program
            variant.predict([list(s.tokens) for s in test[:32]])  # warm-up
            report = score(variant.predict, test, 32)
            results["variants"][label] = {
                "f1": round(report["f1"], 4),
                "words_per_second": round(report["words_per_second"]),
                "encoder_bytes": encoder_file(folder).stat().st_size,
            }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.model}, CoNLL-2003 test, batches of 32, calibration on {len(calibration)} training sentences")
    print("| encoder | F1 | words/s | encoder MB |")
    print("|---|---:|---:|---:|")
    for label, r in results["variants"].items():
        print(f"| {label} | {r['f1']:.4f} | {r['words_per_second']} | {r['encoder_bytes'] / 1e6:.1f} |")


if __name__ == "__main__":
    main()
