"""One error table and one envelope: every error kind the service names has its status in
ERROR_STATUS, and every body is written by `envelope` — nerserve's shape, or the Open Inference
Protocol's under /v2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nerserve.service.api.errors import ERROR_STATUS, envelope, error_body, error_response

SERVICE = Path(__file__).resolve().parent.parent / "nerserve" / "service"
NAMED_KIND = re.compile(r"""(?:ApiError|error_body|error_response)\(\s*["']([a-z_]+)["']""")


def test_every_error_kind_the_service_names_is_in_the_table() -> None:
    named = {kind for path in SERVICE.rglob("*.py") for kind in NAMED_KIND.findall(path.read_text())}
    assert len(named) >= 15  # the pattern finds them
    assert named - set(ERROR_STATUS) == set()


def test_no_error_body_is_written_by_hand() -> None:
    """Only errors.py puts an "error" key in a response body."""
    for path in SERVICE.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for line in path.read_text().splitlines():
            if re.search(r"""JSONResponse\(\s*\{\s*["']error["']""", line):
                pytest.fail(f"{path}: {line.strip()}")


@pytest.mark.parametrize("path", ["/extract", "/models", "", "/v2x/models"])
def test_nerserve_envelope(path: str) -> None:
    body = envelope("unknown_model", "unknown model 'x'", "model", path)
    assert body == {"error": {"code": "unknown_model", "message": "unknown model 'x'", "field": "model"}}


@pytest.mark.parametrize("path", ["/v2", "/v2/models/span-conll03/infer", "/v2/health/ready"])
def test_open_inference_protocol_envelope(path: str) -> None:
    assert envelope("invalid_tensor", "inputs[0].shape: wrong", "inputs", path) == {"error": "inputs[0].shape: wrong"}
    assert error_body("unauthorized", "missing API key", "authorization", path) == b'{"error": "missing API key"}'


def test_response_status_from_the_table_unless_starlette_named_another() -> None:
    assert error_response("queue_full", "overloaded").status_code == 429
    assert error_response("request_timeout", "slow headers").status_code == 408
    assert error_response("http_error", "teapot", status=418).status_code == 418
