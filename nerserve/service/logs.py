"""The server's logs: one format for every process of a server (the engine, its HTTP workers) and
for uvicorn's own lines, as text for a person or as JSON lines for a log collector (Loki,
Elasticsearch, Cloud Logging read a line's fields without a pattern), and the access log's line a
request."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

LogFormat = Literal["text", "json"]
ACCESS = logging.getLogger("nerserve.access")
# an access line's fields, given to its record as attributes (`extra`): a JSON line carries each
ACCESS_FIELDS = ("method", "path", "status", "duration_ms", "model", "key", "request_id", "trace_id")


class JsonLines(logging.Formatter):
    """A record as one JSON object: time (UTC, ISO 8601), level, logger, process, message, the
    access line's fields where it has them, and an exception's traceback as one string."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "process": self.process,
            "message": record.getMessage(),
        }
        for name in ACCESS_FIELDS:
            if name in record.__dict__:
                entry[name] = record.__dict__[name]
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(log_format: LogFormat, process: str) -> None:
    """The process's log lines, at INFO, on standard error; PROCESS names it in each line ("engine",
    "http-1", …; in text only where the server has several processes: "" leaves it out). uvicorn's
    loggers reach the same handler (the server gives uvicorn no logging configuration of its own)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonLines(process or "server"))
    else:
        where = f"[{process}]" if process else ""
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.captureWarnings(True)  # a Python warning is a line in the same format, not bare text


def log_access(
    method: str,
    path: str,
    status: int,
    seconds: float,
    model: str,
    key: str | None,
    request_id: str,
    trace_id: str | None = None,
) -> None:
    """The access log's line for one answered request."""
    milliseconds = round(seconds * 1000, 2)
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": milliseconds,
        "model": model or None,
        "key": key,
        "request_id": request_id,
        "trace_id": trace_id,
    }
    trace = f" trace_id={trace_id}" if trace_id else ""
    ACCESS.info(
        "%s %s %d %.2f ms model=%s key=%s request_id=%s%s",
        method, path, status, milliseconds, model or "-", key or "-", request_id, trace, extra=fields,
    )  # fmt: skip
