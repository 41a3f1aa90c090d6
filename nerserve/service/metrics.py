"""Prometheus metrics and the live efficiency table of GET /stats."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from nerserve import __version__
from nerserve.service.batch_log import BatchLog
from nerserve.service.batching.work import BatchRecord

# (model, status, API key name or None, seconds or None) → counted: Metrics.record_response, or the
# message that carries it to the engine process from an HTTP worker
ResponseRecorder = Callable[[str, int, str | None, float | None], None]
ResponseRecord = tuple[str, int, str | None, float | None]  # a ResponseRecorder's arguments

# the batcher's threads by their names' prefix (service.batching.scheduler); the main thread runs
# the event loop; any other Python thread is "other"
THREAD_ROLES = ("prepare", "graphs", "decode")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


# below this many values numpy's fixed cost a call is more than the library's observe of each
BULK_OBSERVE_FROM = 8


def observe_each(histogram: Histogram, values: list[float]) -> None:
    """`histogram.observe` for each value (a batch's queue times, one a sentence), counted into its
    buckets at once: the client library counts one observation at a time, under a lock, in Python,
    and the engine's loop observed thousands a second. The library's own per-value path for a few
    values, and where its internals are not the ones read here."""
    bounds, buckets, total = (getattr(histogram, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if len(values) < BULK_OBSERVE_FROM or bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    # observe puts a value in the first bucket whose upper bound is at least the value
    counts = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds))
    total.inc(float(sum(values)))
    for bucket, count in zip(buckets, counts.tolist(), strict=False):
        if count:
            bucket.inc(count)


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process's Python threads, by role: the event loop (the main
    thread), the batcher's prepare, graphs (the lanes, which launch a device's passes) and decode
    threads, and other; read from /proc (Linux; empty elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:  # not Linux, or the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold spaces
        prefix = thread.name.split("_")[0]
        role = "loop" if thread is threading.main_thread() else prefix if prefix in THREAD_ROLES else "other"
        seconds[role] = seconds.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return seconds


class ThreadCpuCollector(Collector):
    """`nerserve_thread_cpu_seconds_total{role}`: where a process whose interpreter is the limit (an
    engine launching a GPU's passes from Python, its loop and host work sharing one lock) spends
    its CPU. Read at each scrape."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "nerserve_thread_cpu_seconds", "CPU seconds of this process's Python threads by role", labels=["role"]
        )
        for role, seconds in sorted(thread_cpu_seconds().items()):
            family.add_metric([role], seconds)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._labelled: dict[tuple[Counter | Histogram, tuple[str, ...]], Any] = {}  # _series
        r = self.registry
        # the default collectors (process memory and CPU, open files, GC, Python version) that a
        # Prometheus user expects beside the service's own series; and which build answers
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, ThreadCpuCollector()):
            r.register(collector)
        Info("nerserve_build", "The running build", registry=r).info({"version": __version__})
        self.requests = Counter("nerserve_requests", "Requests by model and HTTP status", ["model", "status"], registry=r)
        self.request_seconds = Histogram(
            "nerserve_request_seconds", "End-to-end request latency", ["model"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_seconds = Histogram(
            "nerserve_queue_seconds",
            "Time sentences waited before their batch ran",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "nerserve_inference_seconds",
            "Graph + decode time per batch",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_sentences = Histogram(
            "nerserve_batch_sentences", "Sentences per batch", ["model"], buckets=SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "nerserve_batch_tokens", "Padded sub-word tokens per batch", ["model"], buckets=TOKEN_BUCKETS, registry=r
        )
        self.padding_ratio = Histogram(
            "nerserve_batch_padding_ratio",
            "Share of padded positions per batch",
            ["model"],
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9),
            registry=r,
        )
        self.queue_depth = Gauge("nerserve_queue_depth", "Sentences waiting", ["model"], registry=r)
        self.graph_provider = Gauge(
            "nerserve_graph_execution_provider",
            "1 for what each loaded graph actually runs on (ONNX Runtime's provider after any fall-back, or the torch device)",
            ["model", "graph", "provider"],
            registry=r,
        )
        self.in_flight = Gauge("nerserve_in_flight", "Sentences accepted and not yet answered", ["model"], registry=r)
        self.model_state = Gauge(
            "nerserve_model_state",
            "1 for each model's state (loading, ready, failed to load, broken while serving), 0 for the others",
            ["model", "state"],
            registry=r,
        )
        self.admitted = Gauge(
            "nerserve_admitted_requests", "Requests let through admission and not yet answered, every model", registry=r
        )
        self.sentences = Counter("nerserve_sentences", "Sentences processed", ["model"], registry=r)
        self.tokens = Counter("nerserve_tokens", "Sub-word tokens processed (unpadded)", ["model"], registry=r)
        self.dropped = Counter("nerserve_dropped", "Sentences dropped before running", ["model", "reason"], registry=r)
        self.batches_closed = Counter(
            "nerserve_batches_closed",
            "Batches run, by why each closed: full, idle (graphs free), company (graphs free, after waiting for the rest "
            "of a closed loop's clients), clients_back (a closed loop's clients back as "
            "the device frees), waited (max_wait, then the device's turn), halves (half of what an idle device had)",
            ["model", "reason"],
            registry=r,
        )
        # by API key name (configured names, and "unknown" for a missing or wrong key): never a key
        self.key_requests = Counter(
            "nerserve_key_requests", "Requests by API key name and HTTP status", ["key", "status"], registry=r
        )
        self.key_sentences = Counter("nerserve_key_sentences", "Sentences answered by API key name", ["key"], registry=r)
        self.key_request_seconds = Histogram(
            "nerserve_key_request_seconds", "End-to-end latency by API key name", ["key"], buckets=LATENCY_BUCKETS, registry=r
        )

    def record_response(self, model: str, status: int, tenant: str | None, seconds: float | None) -> None:
        """One answered request, whoever answered it (a route, the door, admission, the HTTP
        protocol; in this process or an HTTP worker's): by model ("" when no route resolved one)
        and status, its latency by model, and by key name where the door named one."""
        for series, value in self._response_series(model, status, tenant, seconds):
            if value is None:
                series.inc()
            else:
                series.observe(value)

    def record_responses(self, records: list[ResponseRecord]) -> None:
        """record_response for each of RECORDS (the responses an HTTP worker answered in one turn of
        its loop), each series counted into once: the engine's loop records every response."""
        alike: dict[tuple[str, int, str | None], list[float | None]] = {}
        for model, status, tenant, seconds in records:
            alike.setdefault((model, status, tenant), []).append(seconds)
        for (model, status, tenant), latencies in alike.items():
            timed = [seconds for seconds in latencies if seconds is not None]
            # the histograms come with a latency only where some response has one
            for series, value in self._response_series(model, status, tenant, timed[0] if timed else None):
                if value is None:
                    series.inc(len(latencies))
                else:
                    observe_each(series, timed)

    def _response_series(
        self, model: str, status: int, tenant: str | None, seconds: float | None
    ) -> list[tuple[Any, float | None]]:
        """The series a response counts in: each counter (None) and each histogram with its seconds."""
        code = str(status)
        found: list[tuple[Any, float | None]] = [(self._series(self.requests, model, code), None)]
        if model and seconds is not None:
            found.append((self._series(self.request_seconds, model), seconds))
        if tenant is not None:
            found.append((self._series(self.key_requests, tenant, code), None))
            if seconds is not None:
                found.append((self._series(self.key_request_seconds, tenant), seconds))
        return found

    def _series(self, metric: Counter | Histogram, *labels: str) -> Any:
        """METRIC's series of LABELS, looked up once: `labels()` takes a lock and checks its
        arguments on every call, which made up half of recording a response, and the engine
        records one for every request its HTTP workers answer."""
        key = (metric, labels)
        series = self._labelled.get(key)
        if series is None:
            series = self._labelled[key] = metric.labels(*labels)
        return series

    def by_key(self) -> dict[str, dict[str, Any]]:
        """Per API key name since start: requests by status, refusals (429), sentences answered,
        mean latency (for /stats; /metrics has the histograms)."""
        keys: dict[str, dict[str, Any]] = {}

        def entry(name: str) -> dict[str, Any]:
            return keys.setdefault(name, {"requests": {}, "refused": 0, "sentences": 0, "latency_ms_mean": None})

        for sample in next(iter(self.key_requests.collect())).samples:
            if sample.name.endswith("_total"):
                found = entry(sample.labels["key"])
                found["requests"][sample.labels["status"]] = int(sample.value)
                if sample.labels["status"] == "429":
                    found["refused"] += int(sample.value)
        for sample in next(iter(self.key_sentences.collect())).samples:
            if sample.name.endswith("_total"):
                entry(sample.labels["key"])["sentences"] = int(sample.value)
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for sample in next(iter(self.key_request_seconds.collect())).samples:
            if sample.name.endswith("_sum"):
                sums[sample.labels["key"]] = sample.value
            elif sample.name.endswith("_count"):
                counts[sample.labels["key"]] = sample.value
        for name, count in counts.items():
            if count:
                entry(name)["latency_ms_mean"] = round(1000 * sums.get(name, 0.0) / count, 3)
        return keys


@dataclass
class RollingStats:
    """Batches of the last minute (and totals since start) → the papers' efficiency table."""

    started: float = field(default_factory=time.monotonic)
    recent: deque[BatchRecord] = field(default_factory=deque)
    sentences: int = 0
    tokens: int = 0
    padded: int = 0
    batches: int = 0

    def add(self, record: BatchRecord) -> None:
        self.recent.append(record)
        self.sentences += record.sentences
        self.tokens += record.tokens
        self.padded += record.padded_tokens
        self.batches += 1
        horizon = record.finished - 60.0
        while self.recent and self.recent[0].finished < horizon:
            self.recent.popleft()

    def window(self, seconds: float, now: float) -> dict[str, float]:
        chosen = [r for r in self.recent if r.finished >= now - seconds]
        span = min(seconds, now - self.started) or 1e-9
        sentences = sum(r.sentences for r in chosen)
        return {"sentences_per_second": sentences / span, "tokens_per_second": sum(r.tokens for r in chosen) / span}

    def table(self) -> dict[str, Any]:
        now = time.monotonic()
        since = max(now - self.started, 1e-9)
        return {
            "last_10s": self.window(10, now),
            "last_1min": self.window(60, now),
            "since_start": {"sentences_per_second": self.sentences / since, "tokens_per_second": self.tokens / since},
            "sentences": self.sentences,
            "batches": self.batches,
            "mean_batch_size": self.sentences / self.batches if self.batches else 0.0,
            "padding_ratio": 1 - self.tokens / self.padded if self.padded else 0.0,
        }


class ModelObserver:
    """Feeds one model's scheduler events into Prometheus and the rolling table."""

    def __init__(self, metrics: Metrics, model: str, batch_log: BatchLog | None = None) -> None:
        self.metrics = metrics
        self.model = model
        self.batch_log = batch_log
        self.stats = RollingStats()
        # the model's own series, looked up once: a batch observes one queue time per sentence
        self.queue_seconds = metrics.queue_seconds.labels(model)
        self.inference_seconds = metrics.inference_seconds.labels(model)
        self.batch_sentences = metrics.batch_sentences.labels(model)
        self.batch_tokens = metrics.batch_tokens.labels(model)
        self.padding_ratio = metrics.padding_ratio.labels(model)
        self.sentences = metrics.sentences.labels(model)
        self.tokens = metrics.tokens.labels(model)

    def batch_done(self, record: BatchRecord) -> None:
        observe_each(self.queue_seconds, record.queue_seconds)
        self.inference_seconds.observe(record.run_seconds)
        self.batch_sentences.observe(record.sentences)
        self.batch_tokens.observe(record.padded_tokens)
        self.padding_ratio.observe(1 - record.tokens / record.padded_tokens if record.padded_tokens else 0)
        self.sentences.inc(record.sentences)
        self.tokens.inc(record.tokens)
        self.metrics.batches_closed.labels(self.model, record.closed or "unknown").inc()
        self.stats.add(record)
        if self.batch_log is not None:
            self.batch_log.write(self.model, record)

    def dropped(self, reason: str, count: int) -> None:
        self.metrics.dropped.labels(self.model, reason).inc(count)
