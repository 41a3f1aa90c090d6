"""One table from error kinds to status codes, and the one place error bodies are written: every
route's {"error": {"code", "message", "field"}}, or under /v2 the Open Inference Protocol's
{"error": "<message>"}, which Triton's clients read. Bad input is never a 500."""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ERROR_STATUS: dict[str, int] = {
    "malformed_json": 400,
    "malformed_body": 400,  # a compressed body that does not decompress
    "invalid_tensor": 400,  # a KServe v2 request whose tensors or parameters are wrong (the protocol's 400)
    "unauthorized": 401,
    "unknown_model": 404,
    "unknown_version": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "payload_too_large": 413,
    "too_many_texts": 413,
    "too_many_sentences": 413,
    "unsupported_media_type": 415,
    "invalid_request": 422,
    "invalid_option": 422,
    "unknown_label": 422,
    "queue_full": 429,
    "key_over_ceiling": 429,
    "client_gone": 499,  # the client closed the connection first (nginx's convention); nobody reads it
    "not_ready": 503,
    "model_failed": 503,
    "draining": 503,
    "engine_unavailable": 503,  # an HTTP worker that lost its engine process (it is stopping)
    "deadline_exceeded": 504,
    "internal": 500,
}


class ApiError(Exception):
    def __init__(self, code: str, message: str, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.code]


KSERVE_V2 = "/v2"


def envelope(code: str, message: str, field: str | None = None, path: str = "") -> dict[str, Any]:
    """The error body for a request to PATH."""
    if path == KSERVE_V2 or path.startswith(KSERVE_V2 + "/"):
        return {"error": message}
    return {"error": {"code": code, "message": message, "field": field}}


def error_body(code: str, message: str, field: str | None = None, path: str = "") -> bytes:
    """The envelope as bytes, for the answers written below FastAPI (the edge's 429, the door's 401,
    the protocol's 408)."""
    return json.dumps(envelope(code, message, field, path)).encode()


def error_response(
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    path: str = "",
    status: int | None = None,
) -> JSONResponse:
    """`status`: only for a status the table has no kind for (an HTTP error Starlette raised)."""
    return JSONResponse(envelope(code, message, field, path), status_code=status or ERROR_STATUS[code], headers=headers)


def _location(loc: tuple[Any, ...]) -> str:
    # pydantic names the union member a value failed in ("list[str]"): not a place in the request
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and "[" in p)]
    text = ""
    for part in parts:
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text


async def api_error_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(error.code, error.message, error.field, error.headers, request.url.path)


async def validation_error_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    errors = list(error.errors())
    first: dict[str, Any] = dict(errors[0]) if errors else {"type": "", "loc": (), "msg": "invalid request"}
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") == "missing":
        message = 'request body is empty: send a JSON object, e.g. {"texts": ["..."]}'
        return error_response("malformed_json", message, path=request.url.path)
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") in ("model_attributes_type", "dict_type"):
        # FastAPI reads a body as JSON only when it is declared so (or not declared at all): JSON
        # sent as text/plain arrives as a string, which is not "malformed JSON" to the one who sent it.
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not media_type:  # FastAPI reads no body as JSON without its word (a browser's cross-site form can send one)
            message = "request body must be sent as application/json: the request has no content-type header"
            return error_response("unsupported_media_type", message, "content-type", path=request.url.path)
        if media_type != "application/json" and not media_type.endswith("+json"):
            message = f"request body must be sent as application/json, not {media_type}"
            return error_response("unsupported_media_type", message, "content-type", path=request.url.path)
        return error_response("malformed_json", "request body must be a JSON object", path=request.url.path)
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return error_response("malformed_json", f"request body is not valid JSON: {detail}", path=request.url.path)
    field = _location(tuple(first.get("loc", ()))) or None
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if field and (inner := _inner_location(field, message)):
        # a list's validator names the item it failed on: that item is the place, said once
        return error_response("invalid_request", message, inner, path=request.url.path)
    return error_response("invalid_request", f"{field}: {message}" if field else message, field, path=request.url.path)


def _inner_location(field: str, message: str) -> str | None:
    """The item of FIELD a validator's MESSAGE opens with ("texts[0][2]: …"), if it does."""
    opened = re.match(re.escape(field) + r"(\[\d+\])+(?=: )", message)
    return opened.group(0) if opened else None


def _unparsed_body(cause: BaseException | None) -> str | None:
    """What FastAPI, reading a JSON body, met other than a JSON syntax error (it answers those
    all alike, "There was an error parsing the body")."""
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        return f"request body is not valid UTF-8 (byte 0x{byte} at offset {cause.start}): send JSON as UTF-8"
    if isinstance(cause, RecursionError):
        return "request body nests arrays or objects too deeply to parse"
    return None


async def http_error_handler(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    if error.status_code == 400 and (message := _unparsed_body(error.__cause__)):
        return error_response("malformed_json", message, path=request.url.path)
    code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(error.status_code, "http_error")
    headers = dict(error.headers or {})  # a 405 carries Allow
    allowed = next((value for name, value in headers.items() if name.lower() == "allow"), "")
    message = _routing_message(error, request, allowed) or str(error.detail)
    return error_response(code, message, headers=headers, path=request.url.path, status=error.status_code)


def _routing_message(error: StarletteHTTPException, request: Request, allowed: str) -> str | None:
    """Starlette's bare "Not Found" / "Method Not Allowed" for a path or method no route takes, said
    with what was asked and where the routes are."""
    path = request.url.path
    if error.status_code == 404 and error.detail == HTTPStatus.NOT_FOUND.phrase:
        return f"no route {request.method} {path}: the API's routes are listed at /docs"
    if error.status_code == 405 and error.detail == HTTPStatus.METHOD_NOT_ALLOWED.phrase:
        return f"{request.method} is not allowed on {path}" + (f" (allowed: {allowed})" if allowed else "")
    return None
