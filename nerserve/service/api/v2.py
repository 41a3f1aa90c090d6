"""The KServe v2 / Open Inference Protocol beside /extract, for Triton clients, perf_analyzer and
KServe: health, server and model metadata, and `infer` with a BYTES input `text` (one text per
element) answered by a BYTES output `entities` (one JSON array per text: the same entity objects
as /extract). Request parameters carry `labels` (a JSON array or a comma list), `flat`,
`deadline_ms`, and the model's options. Both JSON tensors and the binary tensor extension
(`Inference-Header-Content-Length`) are read and written, as tritonclient sends them by default.
Errors answer `{"error": "<message>"}`, as the protocol says (api/errors.py writes every error body)."""

from __future__ import annotations

import json
import struct
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nerserve import __version__
from nerserve.service.api.errors import ApiError
from nerserve.service.api.extraction import ExtractionQuery, check_serving, run_extraction
from nerserve.service.api.schemas import ExtractRequest
from nerserve.service.api.state import service_state
from nerserve.service.models import ModelView

v2 = APIRouter(prefix="/v2", tags=["KServe v2 (Open Inference Protocol)"])
INPUT, OUTPUT = "text", "entities"
HEADER_LENGTH = "inference-header-content-length"
Parameter = bool | int | float | str


class TensorIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description=f"{INPUT!r}: the only input")
    shape: list[int]
    datatype: str = Field(description="BYTES: one UTF-8 text per element")
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    data: list[Any] | None = None


class OutputAsked(BaseModel):
    name: str
    parameters: dict[str, Parameter] = Field(default_factory=dict)


class InferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    inputs: list[TensorIn] = Field(min_length=1)
    outputs: list[OutputAsked] | None = None


class V2ErrorBody(BaseModel):
    error: str


V2_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": V2ErrorBody} for code in (400, 404, 413, 422, 429, 503, 504)}
INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "the binary tensor extension: JSON header (Inference-Header-Content-Length bytes), then tensors",
            },
        },
    }
}


def _invalid(message: str) -> ApiError:
    """A request whose tensors or parameters are wrong: the protocol's 400, the message saying where."""
    return ApiError("invalid_tensor", message)


@v2.get("")
async def server_metadata() -> dict[str, Any]:
    return {"name": "nerserve", "version": __version__, "extensions": ["binary_tensor_data"]}


@v2.api_route("/health/live", methods=["GET", "HEAD"], responses={503: {"model": V2ErrorBody}})
async def live(request: Request) -> JSONResponse:
    state = service_state(request)
    return JSONResponse({"live": not state.fatal}, status_code=503 if state.fatal else 200)


@v2.api_route("/health/ready", methods=["GET", "HEAD"], responses={503: {"model": V2ErrorBody}})
async def ready(request: Request) -> JSONResponse:
    state = service_state(request)
    is_ready = state.ready and not state.draining and not state.fatal
    return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)


@v2.get("/models/{name}", responses=V2_ERRORS)
@v2.get("/models/{name}/versions/{version}", responses=V2_ERRORS)
async def model_metadata(name: str, request: Request, version: str | None = None) -> JSONResponse:
    model = service_state(request).model(name)
    return JSONResponse(
        {
            "name": model.name,
            "versions": [model.version],
            "platform": f"nerserve_{model.architecture}",
            "inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": OUTPUT, "datatype": "BYTES", "shape": [-1]}],
            "parameters": {"labels": model.labels, "options": model.info["options"]},
        }
    )


@v2.get("/models/{name}/ready", responses={404: {"model": V2ErrorBody}, 503: {"model": V2ErrorBody}})
@v2.get("/models/{name}/versions/{version}/ready", responses={404: {"model": V2ErrorBody}, 503: {"model": V2ErrorBody}})
async def model_ready(name: str, request: Request, version: str | None = None) -> JSONResponse:
    state = service_state(request)
    if name not in state.model_states:
        raise ApiError("unknown_model", f"unknown model {name!r}; served models: {', '.join(state.model_states) or 'none'}")
    is_ready = state.model_states.get(name) == "ready" and not state.draining
    return JSONResponse({"name": name, "ready": is_ready}, status_code=200 if is_ready else 503)


def _split_body(raw: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return raw, b""
    if not header_length.isdigit() or int(header_length) > len(raw):
        raise _invalid(f"{HEADER_LENGTH}: {header_length!r} is not a length within the body")
    return raw[: int(header_length)], raw[int(header_length) :]


def _bytes_elements(blob: bytes) -> list[bytes]:
    """A BYTES tensor in binary form: each element a 4-byte little-endian length, then the bytes."""
    out, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise _invalid("binary BYTES tensor: truncated element length")
        (size,) = struct.unpack_from("<I", blob, at)
        if at + 4 + size > len(blob):
            raise _invalid("binary BYTES tensor: element longer than the data")
        out.append(blob[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def _texts(request: InferRequest, binary: bytes) -> list[str]:
    if len(request.inputs) != 1 or request.inputs[0].name != INPUT:
        names = [tensor.name for tensor in request.inputs]
        raise _invalid(f"inputs: expected exactly one input named {INPUT!r}, got {names}")
    tensor = request.inputs[0]
    if tensor.datatype != "BYTES":
        raise _invalid(f"inputs[0].datatype: {INPUT!r} is BYTES (one UTF-8 text per element), got {tensor.datatype}")
    size = tensor.parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size != len(binary):
            raise _invalid(f"inputs[0].parameters.binary_data_size: {size!r} does not match the {len(binary)} bytes sent")
        elements: list[Any] = _bytes_elements(binary)
    elif tensor.data is not None:
        elements = _flatten(tensor.data)
    else:
        raise _invalid("inputs[0]: neither data nor binary_data_size")
    count = 1
    for dimension in tensor.shape:
        count *= dimension
    if count != len(elements):
        raise _invalid(f"inputs[0].shape: {tensor.shape} holds {count} elements, {len(elements)} were sent")
    texts = []
    for index, element in enumerate(elements):
        if isinstance(element, bytes):
            try:
                element = element.decode("utf-8")
            except UnicodeDecodeError:
                raise _invalid(f"inputs[0].data[{index}]: not UTF-8") from None
        if not isinstance(element, str):
            raise _invalid(f"inputs[0].data[{index}]: a BYTES element is a string, got {type(element).__name__}")
        texts.append(element)
    return texts


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major, as the protocol lays out nested JSON tensor data."""
    return [leaf for item in data for leaf in (_flatten(item) if isinstance(item, list) else [item])]


def _query(texts: list[str], parameters: dict[str, Parameter]) -> ExtractionQuery:
    options: dict[str, Any] = {}
    query = ExtractionQuery(texts=texts)
    for key, value in parameters.items():
        if key == "labels":
            query.labels = _labels(value)
        elif key == "flat":
            if not isinstance(value, bool):
                raise _invalid(f"parameters.flat: a boolean, got {value!r}")
            query.flat = value
        elif key == "deadline_ms":
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise _invalid(f"parameters.deadline_ms: a number > 0, got {value!r}")
            query.deadline_ms = float(value)
        elif key not in ("binary_data_size", "binary_data_output", "sequence_id", "priority", "timeout"):  # the protocol's
            options[key] = value
    query.options = options
    return query


def _labels(value: Parameter) -> list[str]:
    if not isinstance(value, str):
        raise _invalid("parameters.labels: a JSON array of names or a comma-separated string")
    if value.lstrip().startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise _invalid(f"parameters.labels: not a JSON array ({error})") from None
        if not isinstance(parsed, list) or not all(isinstance(name, str) for name in parsed):
            raise _invalid("parameters.labels: a JSON array of strings")
        names: list[str] = parsed
    else:
        names = [name.strip() for name in value.split(",") if name.strip()]
    try:
        ExtractRequest(texts=[""], labels=names)  # the same label rules as /extract
    except ValidationError as error:
        detail = error.errors()[0]
        where = ".".join(str(p) for p in detail["loc"])
        raise _invalid(f"parameters.{where}: {str(detail['msg']).removeprefix('Value error, ')}") from None
    return names


def _answer(request: InferRequest, model: ModelView, entities: list[list[dict[str, Any]]]) -> Response:
    strings = [json.dumps(found, ensure_ascii=False) for found in entities]
    asked = {o.name: o for o in request.outputs or []}
    if asked and set(asked) != {OUTPUT}:
        raise _invalid(f"outputs: the only output is {OUTPUT!r}, asked {sorted(asked)}")
    binary = bool(asked.get(OUTPUT, OutputAsked(name=OUTPUT)).parameters.get("binary_data")) or bool(
        request.parameters.get("binary_data_output")
    )
    output: dict[str, Any] = {"name": OUTPUT, "datatype": "BYTES", "shape": [len(strings)]}
    blob = b""
    if binary:
        encoded = [s.encode("utf-8") for s in strings]
        blob = b"".join(struct.pack("<I", len(e)) + e for e in encoded)
        output["parameters"] = {"binary_data_size": len(blob)}
    else:
        output["data"] = strings
    body: dict[str, Any] = {"model_name": model.name, "model_version": model.version, "outputs": [output]}
    if request.id is not None:
        body["id"] = request.id
    header = json.dumps(body, ensure_ascii=False).encode("utf-8")
    if not binary:
        return Response(header, media_type="application/json")
    return Response(
        header + blob,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


@v2.post("/models/{name}/infer", responses=V2_ERRORS, openapi_extra=INFER_BODY)
@v2.post("/models/{name}/versions/{version}/infer", responses=V2_ERRORS, openapi_extra=INFER_BODY)
async def infer(name: str, request: Request, version: str | None = None) -> Response:
    return await infer_answer(request, name, version, await request.body())


async def infer_answer(request: Request, name: str, version: str | None, raw: bytes) -> Response:
    """What `infer` answers to RAW, the request's body (the route's work, shared with its lane:
    service.api.lanes)."""
    state = service_state(request)
    check_serving(state)
    model = state.model(name)
    request.state.model = model.name  # for the response counter (service.main.CountResponses)
    head, binary = _split_body(raw, request.headers.get(HEADER_LENGTH))
    try:
        parsed = InferRequest.model_validate_json(head)
    except ValidationError as error:
        detail = error.errors()[0]
        where = ".".join(str(p) for p in detail["loc"]) or "body"
        raise _invalid(f"{where}: {detail['msg']}") from None
    query = _query(_texts(parsed, binary), {**parsed.parameters, **parsed.inputs[0].parameters})
    if version is not None and version != model.version:
        message = f"model {name!r} has version {model.version!r}, not {version!r}"
        raise ApiError("unknown_version", message, "version")
    done = await run_extraction(request, model.name, query)
    return _answer(parsed, model, done.entities)
