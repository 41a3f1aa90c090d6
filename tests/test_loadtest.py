"""The load tester: statistics and scheduling on synthetic numbers, then a smoke run against a
real server started by the test (loopback only, bounded in time)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nerserve.loadtest.client import Order, arrange, parse_metrics, read_sentences
from nerserve.loadtest.protocols import protocol_batches, setgen_batches
from nerserve.loadtest.report import knee, slo_throughput
from nerserve.loadtest.schedule import arrivals, sweep_rates
from nerserve.loadtest.stats import is_stable, percentile, summarize
from tests.serving import Server


def test_percentiles_are_exact() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentile(samples, 50) == pytest.approx(0.0505)
    assert percentile(samples, 99) == pytest.approx(0.09901)
    assert percentile([0.2], 99.9) == 0.2
    summary = summarize(samples)
    assert summary["p50"] == pytest.approx(50.5) and summary["max"] == pytest.approx(100)


def test_schedules_are_precomputed_and_bounded() -> None:
    constant = arrivals(10, 2.0, "constant")
    assert constant == [i / 10 for i in range(20)]
    poisson = arrivals(200, 10.0, "poisson", seed=1)
    assert poisson == sorted(poisson) and all(0 < t < 10 for t in poisson)
    assert 1800 < len(poisson) < 2200  # ≈ rate × duration
    assert arrivals(200, 10.0, "poisson", seed=1) == poisson  # reproducible
    assert sweep_rates(10, 1000, 3) == [10.0, 100.0, 1000.0]
    with pytest.raises(ValueError):
        arrivals(1, 1, "bursty")


def test_protocol_batching() -> None:
    sentences = [["w"] * n for n in (10, 300, 500, 20, 20, 790, 5)]
    batches = setgen_batches(sentences)
    assert all(max(map(len, b)) * len(b) <= 800 or len(b) == 1 for b in batches)
    assert [s for b in batches for s in b] == sentences  # fixed order, nothing dropped
    nag, repeat = protocol_batches("nag", sentences)
    assert repeat and nag == [sentences[:4]]
    gner, _ = protocol_batches("gner", sentences)
    assert [len(b) for b in gner] == [4, 3]


def test_stability_knee_slo_and_metrics_parsing() -> None:
    assert is_stable([100, 101, 100.5]) and not is_stable([100, 120, 100])
    runs = [
        {"mode": "open", "rate": r, "ok": 1, "errors": e, "sentences_per_second": s, "latency_ms": {"p99": p}}
        for r, s, p, e in ((10, 10, 20, 0), (50, 50, 30, 0), (100, 90, 120, 0), (200, 95, 900, 3))
    ]
    assert knee(runs)["rate"] == 50
    assert slo_throughput(runs, 130)["rate"] == 100
    text = '# HELP x\nnerserve_tokens_total{model="m"} 42.0\nnerserve_queue_depth{model="m"} 3\n'
    assert parse_metrics(text) == {'nerserve_tokens_total{model="m"}': 42.0, 'nerserve_queue_depth{model="m"}': 3.0}


def test_a_shuffled_split_sends_a_sample_of_it_in_every_prefix(data_root: Path) -> None:
    """A run over a duration sends a prefix of the split: shuffled, that prefix is a sample of it
    (two servers that get through different numbers of sentences are timed on the same work); in
    file order CoNLL-2003 test's first sentences are its short result tables."""
    split = read_sentences(data_root / "conll03")

    def mean_words(sentences: list[list[str]]) -> float:
        return sum(map(len, sentences)) / len(sentences)

    shuffled = arrange(split, Order.SHUFFLED)
    assert sorted(map(tuple, shuffled)) == sorted(map(tuple, split))  # every sentence, once
    assert arrange(split, Order.SHUFFLED) == shuffled  # the same order every run
    assert arrange(split, Order.SHUFFLED, seed=1) != shuffled
    assert arrange(split, Order.FILE) == split
    whole = mean_words(split)
    for prefix in (1150, 1750):
        assert abs(mean_words(shuffled[:prefix]) / whole - 1) < 0.03
    assert mean_words(split[:1150]) / whole < 0.95 and mean_words(split[:1750]) / whole > 1.08


def loadtest(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "nerserve.loadtest", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_smoke_against_a_real_server(data_root: Path, tmp_path: Path) -> None:
    server = Server(models='["span-conll03"]', threads=1)
    try:
        server.wait_ready()
        common = ["--model", "span-conll03", "--data", str(data_root / "conll03"), "--url", server.url]
        closed = loadtest(
            "run", *common, "--mode", "closed", "--concurrency", "1,4", "--duration", "2", "--out", str(tmp_path / "closed")
        )
        assert "| closed | c=4 |" in closed
        summary = json.loads((tmp_path / "closed" / "summary.json").read_text())
        assert [r["concurrency"] for r in summary["runs"]] == [1, 4]
        assert summary["meta"]["order"] == "shuffled"
        assert all(r["ok"] > 0 and r["errors"] == 0 for r in summary["runs"])
        # the server's own CPU, from its /metrics: busy answering, and on at most this machine's cores
        assert all(0 < r["server_process_cores_busy"] < 3 for r in summary["runs"])
        assert (tmp_path / "closed" / "throughput_latency.png").stat().st_size > 1000
        # --once: every request of the split answered exactly once, then the run ends
        few = tmp_path / "few"
        few.mkdir()
        lines = (data_root / "conll03" / "test.jsonl").read_text(encoding="utf-8").splitlines()[:10]
        (few / "test.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        once = ["--mode", "closed", "--concurrency", "4", "--once", "--duration", "60", "--out", str(tmp_path / "once")]
        loadtest("run", "--model", "span-conll03", "--data", str(few), "--url", server.url, *once)
        (run,) = json.loads((tmp_path / "once" / "summary.json").read_text())["runs"]
        assert run["ok"] == 10 and run["errors"] == 0
        opened = loadtest(
            "run",
            *common,
            "--mode",
            "open",
            "--sweep",
            "10:20:2",
            "--duration",
            "2",
            "--slo-p99-ms",
            "5000",
            "--out",
            str(tmp_path / "open"),
        )
        assert "SLO p99 < 5000.0 ms: 20.0 requests/s" in opened
        assert (tmp_path / "open" / "overload.png").stat().st_size > 1000  # the sweep's goodput / p99 curve
        table = loadtest(
            "protocol",
            "--table",
            "nag",
            "--models",
            "span-conll03",
            "--data",
            str(data_root / "conll03"),
            "--url",
            server.url,
            "--max-seconds",
            "3",
            "--json",
        )
        rows = json.loads(table)["rows"]
        assert rows[0]["sentences_per_second"] > 0 and rows[0]["model_only_sentences_per_second"] > 0
        assert rows[-1]["reference"] and rows[-1]["speedup"] == 1.0
    finally:
        server.stop()


def test_table_rows_carry_per_request_options() -> None:
    from nerserve.loadtest.client import model_row

    assert model_row("span-conll03") == ("span-conll03", {})
    assert model_row("diffusion-conll03?steps=1&proposals=60") == ("diffusion-conll03", {"steps": 1, "proposals": 60})
    assert model_row("setgen-cadec?beams=1&head_threshold=0.45") == ("setgen-cadec", {"beams": 1, "head_threshold": 0.45})
