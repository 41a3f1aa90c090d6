"""Render docs/reference-run/*.json (written by benchmarks/reference_run.sh) as docs/reference-run.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/reference-run")


def load(name: str) -> Any:
    path = OUT / name
    return json.loads(path.read_text()) if path.is_file() else None


def main() -> None:
    lines = [
        "# Reference run on CPU",
        "",
        "Regenerate with `bash benchmarks/reference_run.sh && python benchmarks/render_reference.py` "
        "on an otherwise idle machine.",
        "",
    ]
    meta = load("open/summary.json") or load("closed/summary.json")
    if meta:
        lines += [f"Client and server on one machine: {meta['meta']['client_machine']}; {meta['meta']['when']}.", ""]
    lines += [
        "## Accuracy and offline speed (`nerserve eval ... --json`, batches of 32, length-sorted)",
        "",
        "| model | runtime | P | R | F1 | nested F1 | sentences/s | words/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for path in sorted(OUT.glob("eval-*.json")):
        r = json.loads(path.read_text())
        nested = r["nested"]["f1"] if r["nested"]["gold"] else float("nan")
        lines.append(
            f"| {r['model']} | {r['runtime']} | {r['precision']:.4f} | {r['recall']:.4f} | {r['f1']:.4f} | "
            f"{nested:.4f} | {r['sentences_per_second']:.1f} | {r['words_per_second']:.0f} |"
        )
    peer = load("cpu-peer.json")
    if peer:
        spacy = peer["spacy_en_core_web_sm"]
        lines += [
            "",
            "## CPU peer: spaCy en_core_web_sm (tok2vec + ner), same run, CoNLL-2003 test",
            "",
            "| system | F1 | words/s | × spaCy |",
            "|---|---:|---:|---:|",
        ]
        for label in ("onnx_fp32", "onnx_int8"):
            r = peer[label]
            lines.append(f"| span-conll03 {label} | {r['f1']:.4f} | {r['words_per_second']:.0f} | {r['vs_spacy']:.2f} |")
        lines.append(
            f"| spaCy {spacy['version']} {'+'.join(spacy['pipeline'])} | n/a | {spacy['words_per_second']:.0f} | 1.00 |"
        )
        lines += ["", "Where nerserve's time goes (seconds over the split):", ""]
        for label in ("onnx_fp32", "onnx_int8"):
            lines.append(f"- {label}: {peer[label]['profile_seconds']}")
    for table in ("nag", "setgen"):
        rows = [row for path in sorted(OUT.glob(f"protocol-{table}-*.json")) for row in json.loads(path.read_text())["rows"]]
        if not rows:
            continue
        title = {
            "nag": "NAG-NER protocol (fixed batch of 4 sentences, concurrency 1)",
            "setgen": "SetGNER protocol (test set in batches ≤ 800 tokens, fixed order)",
        }[table]
        lines += [
            "",
            f"## {title}",
            "",
            "| model | batching | settings | sentences/s end-to-end | model-only | speed-up |",
            "|---|---|---|---:|---:|---:|",
        ]
        for r in rows:
            settings = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["settings"].items())
            lines.append(
                f"| {r['model']} | {r['batching']} | {settings} | {r['sentences_per_second']:.1f} | "
                f"{r['model_only_sentences_per_second']:.1f} | {r['speedup']:.2f}× |"
            )
    for name, title in (
        ("closed", "Closed loop (1 sentence per request)"),
        ("open", "Open loop (Poisson arrivals)"),
        ("closed-batch1", "Closed loop with --max-batch-size 1"),
    ):
        table_file = OUT / name / "table.md"
        if table_file.is_file():
            lines += ["", f"## {title}", "", table_file.read_text().strip()]
    closed, single = load("closed/summary.json"), load("closed-batch1/summary.json")
    if closed and single:
        c64 = next(r for r in closed["runs"] if r["concurrency"] == 64)
        s64 = single["runs"][0]
        lines += [
            "",
            f"Batching gain at concurrency 64: {c64['sentences_per_second']:.1f} / "
            f"{s64['sentences_per_second']:.1f} = **{c64['sentences_per_second'] / s64['sentences_per_second']:.2f}×** "
            f"(p50 {c64['latency_ms']['p50']:.0f} vs {s64['latency_ms']['p50']:.0f} ms, "
            f"p99 {c64['latency_ms']['p99']:.0f} vs {s64['latency_ms']['p99']:.0f} ms).",
        ]
    opened = load("open/summary.json")
    if opened and opened.get("slo"):
        best = opened["slo"]["best"]
        lines += [
            "",
            f"SLO p99 < {opened['slo']['p99_ms']} ms: "
            + (f"{best['rate']} requests/s, {best['sentences_per_second']:.1f} sentences/s" if best else "no rate met it")
            + ".",
        ]
    lines += [
        "",
        "![throughput-latency](reference-run/closed/throughput_latency.png)",
        "![throughput-latency, open loop](reference-run/open/throughput_latency.png)",
        "",
    ]
    Path("docs/reference-run.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
