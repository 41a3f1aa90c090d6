"""The application: lifespan (load models in the background, warm up, drain on shutdown), error
handlers, body-size limit, and `run()` for `nerserve serve`."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nerserve import __version__
from nerserve.ner.runtime import DeviceUnavailable, resolve_device
from nerserve.service.admission import EdgeAdmission
from nerserve.service.api.errors import (
    ApiError,
    api_error_handler,
    error_response,
    http_error_handler,
    validation_error_handler,
)
from nerserve.service.api.routes import router
from nerserve.service.api.state import ServiceState
from nerserve.service.api.v2 import v2
from nerserve.service.auth import Door, KeyAuth, tenant_of
from nerserve.service.config import Settings
from nerserve.service.http_protocol import HeaderDeadlineProtocol
from nerserve.service.metrics import Metrics
from nerserve.service.models import decoder_loop_length, load_served_model, model_names
from nerserve.service.start_up_exports import Exporter
from nerserve.service.tenants import Tenants, read_api_keys

log = logging.getLogger("nerserve")
WARMUP = [["Warm", "up", "sentence", "for", "the", "graphs", "."]]


def loading_order(state: ServiceState) -> list[str]:
    """The default model first, so that it answers while the others load behind it; behind it the
    ones that decode step by step, longest loops first: a first start's parity check runs their
    eager decoder, the longest exports, and starting the longest first keeps the loading lanes
    ending together."""
    names = model_names(state.settings)
    default = state.settings.default_model
    return sorted(names, key=lambda name: (name != default, -decoder_loop_length(name, state.settings), name))


# Models loading at once behind the default one: exporting is mostly single-threaded Python
# (tracing, graph rewriting), so two lanes on two cores halve a first start; more would only
# add memory (an export holds a torch copy of its model).
LOADING_LANES = max(1, min(4, os.cpu_count() or 1))


async def _load_models(state: ServiceState) -> None:
    try:
        names = loading_order(state)
    except Exception as error:
        state.fatal = f"{type(error).__name__}: {error}"
        log.error("cannot serve: %s", state.fatal)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    state.model_states = dict.fromkeys(names, "loading")
    first, *others = names
    await _load_model(state, first, background=False)
    lanes = asyncio.Semaphore(LOADING_LANES)

    async def load_in_background(name: str) -> None:
        async with lanes:
            await _load_model(state, name, background=True)

    await asyncio.gather(*(load_in_background(name) for name in others))
    if not state.models and state.fatal is None:
        state.fatal = "no model could be loaded: " + "; ".join(f"{n}: {e}" for n, e in state.model_errors.items())
        os.kill(os.getpid(), signal.SIGTERM)


async def _load_model(state: ServiceState, name: str, background: bool) -> None:
    if state.fatal is not None:  # another model's failure is stopping the process
        return
    try:
        log.info("loading %s (%s)", name, state.settings.runtime.value)
        model = await asyncio.to_thread(
            load_served_model, name, state.settings, state.metrics, state.exports, background, state.tenants.weight
        )
        await asyncio.to_thread(model.program.predict, WARMUP)
        model.scheduler.start()
    except Exception as error:
        state.model_states[name] = "failed"
        state.model_errors[name] = f"{type(error).__name__}: {error}"
        log.error("model %s failed to load: %s", name, state.model_errors[name])
        if state.settings.on_model_error == "exit" and state.fatal is None:
            state.fatal = f"model {name!r} failed to load: {state.model_errors[name]}"
            os.kill(os.getpid(), signal.SIGTERM)  # graceful stop; run() exits non-zero
        return
    state.models[model.name] = model
    state.model_states[name] = "ready"
    # What loading made (graphs, tokenizers, configs) lives as long as the process: kept out of
    # the collector's full passes, which otherwise walk it all (long gen-2 pauses under load).
    gc.freeze()
    state.ready = True  # readiness: at least one model (the default first) answers
    log.info("ready: %s", name)


class BodyLimit:
    """413 for bodies over the limit, by Content-Length or by counting a streamed body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        message = f"request body over {self.limit} bytes"
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await error_response("payload_too_large", message, path=scope["path"])(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            incoming = await receive()
            if incoming["type"] == "http.request":
                received += len(incoming.get("body", b""))
                if received > self.limit:
                    raise StarletteHTTPException(413, message)
            return incoming

        await self.app(scope, counting_receive, send)


class CountResponses:
    """Counts every response under its real status, whatever produced it (a route, a validation
    error, a 404/405, the body limit, an unhandled exception), with the model the route resolved
    ("" when none); answers an unhandled exception as a JSON 500 naming a request id it logs."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None
        started = time.perf_counter()

        async def watching_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        except Exception:
            request_id = uuid.uuid4().hex[:16]
            log.exception("unhandled error answering %s %s (request id %s)", scope.get("method"), scope.get("path"), request_id)
            if status is None:
                message = f"internal error (request id {request_id})"
                response = error_response("internal", message, headers={"X-Request-Id": request_id}, path=scope["path"])
                await response(scope, receive, watching_send)
        finally:
            model = str(scope.get("state", {}).get("model", ""))
            self.metrics.requests.labels(model, str(status or 500)).inc()
            if "tenant" in scope.get("state", {}):  # a request the API-key door let through
                tenant = tenant_of(scope)
                self.metrics.key_requests.labels(tenant, str(status or 500)).inc()
                self.metrics.key_request_seconds.labels(tenant).observe(time.perf_counter() - started)


def create_app(settings: Settings | None = None, exporter: Exporter | None = None) -> FastAPI:
    """The app; `exporter`: how graphs missing at start-up are exported (the command line gives its
    own; without one, a model without graphs fails to load, saying so)."""
    settings = settings or Settings()
    tenants = Tenants(read_api_keys(settings.api_keys, settings.api_keys_file))
    state = ServiceState(settings, tenants=tenants, exporter=exporter)
    if state.tenants.enabled:
        names = ", ".join(state.tenants.names())
        log.info("API keys: %d (%s); /health, /info and the docs stay open", len(state.tenants.keys), names)
    else:
        log.info("API keys: none configured: every route is open")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(_load_models(state))
        if settings.load_before_serving:
            await asyncio.shield(loader)
        yield
        state.draining = True
        loader.cancel()
        # a model still exporting must not hold the process: stopped while the others drain
        exports_stopped = asyncio.create_task(asyncio.to_thread(state.exports.stop))
        for model in state.models.values():
            await model.scheduler.drain(settings.drain_seconds)
            await model.scheduler.stop()
            await asyncio.to_thread(model.close)
        await exports_stopped

    app = FastAPIOffline(
        title="nerserve",
        version=__version__,
        summary="Flat, nested and discontinuous named entity recognition",
        lifespan=lifespan,
    )
    app.state.service = state
    app.include_router(router)
    app.include_router(v2)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(CountResponses, metrics=state.metrics)  # sees every response the app makes
    return app


def door(state: ServiceState) -> Door:
    return Door(state.tenants, state.metrics, state.settings.protect_metrics)


def with_admission(app: FastAPI) -> ASGIApp:
    """The application as served: CORS (when origins are allowed), the API-key door, then the
    edge admission, outside everything else."""
    state: ServiceState = app.state.service

    def wait(model: str | None, pending: int, tenant: str) -> float | None:
        """Others' work a request not yet read would wait on: for the model its route names, or the
        least loaded model when the name is in the body (the scheduler then decides for the one it
        names)."""
        served = state.models if model is None else {model: state.models[model]} if model in state.models else {}
        return min((m.scheduler.edge_wait(pending, tenant).others for m in served.values()), default=None)

    def open_requests() -> int:
        return sum(model.scheduler.open_requests for model in state.models.values())

    admitted = EdgeAdmission(app, state.settings.max_queue_seconds, wait, open_requests, state.metrics)
    served: ASGIApp = KeyAuth(admitted, door(state))
    if state.settings.cors_allow_origins:
        served = CORSMiddleware(
            served,
            allow_origins=state.settings.cors_allow_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
            expose_headers=["retry-after", "x-queue-time", "x-inference-time"],
        )
    return served


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: readiness off first, then uvicorn's graceful shutdown (stop accepting,
    finish in-flight requests within the drain deadline, run the lifespan shutdown)."""

    def __init__(self, config: uvicorn.Config, state: ServiceState) -> None:
        super().__init__(config)
        self.service_state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.service_state.draining = True
        # As uvicorn's own handler, except that the signal is not re-raised after the graceful
        # shutdown: a drained server exits 0, which orchestrators read as a clean stop.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


# The event loop shares the GIL with the graph thread's numpy decoding: at Python's default 5 ms
# switch interval a refusal or a finished response can wait that long per hand-off under load.
GIL_SWITCH_SECONDS = 0.001


def run(settings: Settings, exporter: Exporter | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    try:  # before anything is exported or loaded: a device that cannot be used ends the process at once
        device = resolve_device(settings.device, settings.runtime.value)
    except DeviceUnavailable as error:
        raise SystemExit(f"nerserve: {error}") from None
    if device != settings.device:
        log.info("--device %s: running on %s", settings.device, device)
        settings = settings.model_copy(update={"device": device})
    app = create_app(settings, exporter)
    HeaderDeadlineProtocol.header_timeout = settings.header_timeout_seconds
    HeaderDeadlineProtocol.metrics = app.state.service.metrics
    HeaderDeadlineProtocol.door = door(app.state.service)
    config = uvicorn.Config(
        with_admission(app),
        host=settings.host,
        port=settings.port,
        http=HeaderDeadlineProtocol,
        timeout_graceful_shutdown=int(settings.drain_seconds) or None,
        log_level="info",
        access_log=settings.access_log,
    )
    state = app.state.service
    DrainingServer(config, state).run()
    if state.fatal:
        raise SystemExit(f"nerserve: {state.fatal}")
