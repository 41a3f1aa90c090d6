"""`--batch-log`: the line a batch gets, and a log that cannot be written (the server goes on)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from nerserve.service.batch_log import BatchLog
from nerserve.service.batching.work import BatchRecord, BatchTimes


def record(sentences: int = 3) -> BatchRecord:
    times = BatchTimes(closed=10.0, handed=10.001, taken=10.002, started=10.003, finished=10.0105, answered=10.011)
    return BatchRecord(sentences, 60, 64, [0.002, 0.005, 0.003], 0.0075, 10.0105, "clients_back", 1, times)


def test_a_line_a_batch_with_its_times_sizes_and_why_it_closed(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "nested" / "batches.jsonl")
    log.write("span-conll03", record())
    log.write("nag-genia", record(5))
    first, second = (json.loads(line) for line in (tmp_path / "nested" / "batches.jsonl").read_text().splitlines())
    assert first == {
        "model": "span-conll03",
        "lane": 1,
        "closed": "clients_back",
        "sentences": 3,
        "subwords": 60,
        "padded_subwords": 64,
        "run_ms": 7.5,
        "device_ms": None,
        "queue_ms": {"min": 2.0, "max": 5.0},
        "at": {"closed": 10.0, "handed": 10.001, "taken": 10.002, "started": 10.003, "finished": 10.0105, "answered": 10.011},
    }
    assert second["model"] == "nag-genia" and second["sentences"] == 5


def test_a_pass_timed_by_the_devices_own_clock_logs_that_time_too(tmp_path: Path) -> None:
    timed = record()
    assert timed.times is not None
    timed.times = dataclasses.replace(timed.times, device_seconds=0.0061234)
    log = BatchLog(tmp_path / "batches.jsonl")
    log.write("span-conll03", timed)
    line = json.loads((tmp_path / "batches.jsonl").read_text())
    assert (line["run_ms"], line["device_ms"]) == (7.5, 6.123)


def test_a_log_that_cannot_be_written_is_said_once_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    log = BatchLog(blocker / "batches.jsonl")  # its folder is a file
    with caplog.at_level(logging.ERROR, logger="nerserve"):
        log.write("span-conll03", record())
        log.write("span-conll03", record())
    said = [r.getMessage() for r in caplog.records if "batch log" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"batch log {blocker / 'batches.jsonl'} cannot be written (")
    assert said[0].endswith("): no more batches are logged")


def test_a_record_without_times_is_not_logged(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "batches.jsonl")
    log.write("span-conll03", BatchRecord(1, 10, 10, [0.001], 0.002, 1.0))
    assert not (tmp_path / "batches.jsonl").exists()
