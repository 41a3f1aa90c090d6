"""HTTP endpoints: POST /extract, GET /models, /info, /health/live, /health/ready, /metrics, /stats."""

from __future__ import annotations

import math
import platform
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from nerserve import __version__
from nerserve.service.api.errors import ApiError
from nerserve.service.api.extraction import Extraction, ExtractionQuery, check_serving, run_extraction
from nerserve.service.api.schemas import ErrorResponse, ExtractRequest, ExtractResponse, InfoResponse, ModelsResponse
from nerserve.service.api.state import service_state

router = APIRouter()
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 404, 413, 415, 422, 429, 503, 504)}


@router.post("/extract", response_model=ExtractResponse, responses=ERRORS, summary="Extract entities")
async def extract(body: ExtractRequest, request: Request, response: Response) -> dict[str, Any]:
    answer, done = await extraction_answer(body, request)
    timing_headers(response, done)
    return answer


async def extraction_answer(body: ExtractRequest, request: Request) -> tuple[dict[str, Any], Extraction]:
    """What POST /extract answers (before the response model checks it), and the extraction's times."""
    state = service_state(request)
    check_serving(state)
    model = state.model(body.model)
    request.state.model = model.name  # for the response counter (service.main.CountResponses)
    query = ExtractionQuery(
        texts=body.texts,
        tokens=body.tokens,
        labels=body.labels,
        options=body.options,
        flat=body.flat,
        deadline_ms=body.deadline_ms or _header_float(request, "x-deadline-ms"),
    )
    done = await run_extraction(request, model.name, query)
    answer = {"model": model.name, "version": model.version, "results": [{"entities": found} for found in done.entities]}
    return answer, done


def timing_headers(response: Response, done: Extraction) -> None:
    """Bare milliseconds, so that a client or a proxy can read them as numbers."""
    response.headers["X-Queue-Time"] = f"{done.queue_seconds * 1000:.3f}"
    response.headers["X-Inference-Time"] = f"{done.inference_seconds * 1000:.3f}"


def _header_float(request: Request, name: str) -> float | None:
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        parsed = float(value)
    except ValueError:
        raise ApiError("invalid_request", f"header {name}: not a number", name) from None
    if not math.isfinite(parsed) or parsed <= 0:
        raise ApiError("invalid_request", f"header {name}: must be a finite number > 0", name)
    return parsed


@router.get("/models", response_model=ModelsResponse)
async def models(request: Request) -> dict[str, Any]:
    state = service_state(request)
    listed = []
    for name, model_state in state.model_states.items():
        if model_state == "ready":
            listed.append({**state.views[name].info, "state": "ready"})
        else:
            listed.append({"name": name, "state": model_state, "error": state.model_errors.get(name)})
    return {"default": state.default_model, "models": listed}


# HEAD too: load balancers' and uptime monitors' health checks often ask with it
@router.api_route("/health/live", methods=["GET", "HEAD"], responses={503: {"model": ErrorResponse}})
async def live(request: Request) -> JSONResponse:
    state = service_state(request)
    if state.fatal:
        return JSONResponse({"status": "broken", "error": state.fatal}, status_code=503)
    return JSONResponse({"status": "live"})


@router.api_route("/health/ready", methods=["GET", "HEAD"], responses={503: {"model": ErrorResponse}})
async def ready(request: Request) -> JSONResponse:
    state = service_state(request)
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if state.fatal:
        return JSONResponse({"status": "failed", "error": state.fatal, "models": state.model_states}, status_code=503)
    if not state.ready:
        return JSONResponse({"status": "loading", "models": state.model_states}, status_code=503)
    return JSONResponse({"status": "ready", "models": state.model_states})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    return Response(await service_state(request).engine.metrics_text(), media_type=CONTENT_TYPE_LATEST)


@router.get("/stats")
async def stats(request: Request) -> dict[str, Any]:
    """The papers' efficiency table, live: sentences/s and tokens/s per model over 10 s, 1 min
    and since start, mean batch size and padding ratio."""
    return await service_state(request).engine.stats()


@router.get("/info", response_model=InfoResponse)
async def info(request: Request) -> dict[str, Any]:
    """What an operator asks first: the version, what is served, on what, with which limits."""
    state = service_state(request)
    settings = state.settings
    device_report = await state.engine.device_report()
    return {
        "version": __version__,
        "python": platform.python_version(),
        "runtime": settings.runtime.value,
        "precision": settings.served_precision,
        "device": settings.device,
        **({"simulated_device": device_report} if device_report is not None else {}),
        "http_workers": settings.front_workers,
        "graph_processes": settings.graph_processes if settings.graph_process else 0,
        "default_model": state.default_model,
        "models": state.model_states,
        "execution_providers": {name: view.info["execution_providers"] for name, view in state.views.items()},
        "batching": {
            "max_batch_size": settings.batch_size_bound,
            "max_batch_tokens": settings.batch_tokens_bound,
            "max_wait_ms": settings.max_wait_ms,
            "max_queue": settings.max_queue,
            "max_queue_seconds": settings.max_queue_seconds,
            "graph_lanes": settings.lanes,
            "graph_threads": settings.graph_threads,
        },
        "limits": {
            "max_texts": settings.max_texts,
            "max_request_sentences": settings.max_request_sentences,
            "max_body_bytes": settings.max_body_bytes,
        },
    }
