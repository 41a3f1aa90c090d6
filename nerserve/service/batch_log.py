"""`--batch-log FILE`: a JSON line per batch, for tuning batching on a device. Where the service's
metrics give a level's averages (batch sizes, pass times, why batches closed), the log gives each
batch's way through the engine: when it closed and why, when it was prepared and handed to the
graph lanes, when a lane took it, its own pass (on a device, from the end of the pass queued before
it), when its answers went out, on the system's monotonic clock (seconds; the same in every process
of the machine, so a load tester's own times split it by level). What a closed loop's clients do
between two passes, how many cohorts they travel in and where the device waits are read from it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import IO

from nerserve.service.batching.work import BatchRecord

log = logging.getLogger("nerserve")


class BatchLog:
    """Appends to PATH, opened at the first batch (an HTTP worker process, which runs no batch,
    never opens it). A log that cannot be written is said once and dropped: it never stops serving."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._failed = False

    def write(self, model: str, record: BatchRecord) -> None:
        if self._failed or record.times is None:
            return
        times = record.times
        line = {
            "model": model,
            "lane": record.lane,
            "closed": record.closed,
            "sentences": record.sentences,
            "subwords": record.tokens,
            "padded_subwords": record.padded_tokens,
            "run_ms": round(record.run_seconds * 1000, 3),
            # the pass on the device's own clock (null where it has none): run_ms less the lane's waits
            "device_ms": None if times.device_seconds is None else round(times.device_seconds * 1000, 3),
            "queue_ms": {
                "min": round(min(record.queue_seconds, default=0.0) * 1000, 3),
                "max": round(max(record.queue_seconds, default=0.0) * 1000, 3),
            },
            "at": {
                "closed": round(times.closed, 6),
                "handed": round(times.handed, 6),
                "taken": round(times.taken, 6),
                "started": round(times.started, 6),
                "finished": round(times.finished, 6),
                "answered": round(times.answered, 6),
            },
        }
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8", buffering=1)  # a line at a time
            self._file.write(json.dumps(line) + "\n")
        except OSError as error:
            self._failed = True
            log.error("batch log %s cannot be written (%s): no more batches are logged", self.path, error)
