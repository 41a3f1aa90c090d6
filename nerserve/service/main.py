"""The application: lifespan (load models in the background, warm up, drain on shutdown), error
handlers, body-size limit, the API-key door and the edge admission around it. Processes and
`nerserve serve` itself: service.server."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nerserve import __version__
from nerserve.service.admission import EdgeAdmission
from nerserve.service.api.errors import (
    ApiError,
    api_error_handler,
    error_response,
    http_error_handler,
    validation_error_handler,
)
from nerserve.service.api.lanes import Lanes
from nerserve.service.api.routes import router
from nerserve.service.api.state import ServiceState
from nerserve.service.api.v2 import v2
from nerserve.service.auth import Door, KeyAuth, key_name
from nerserve.service.config import Settings, usable_cores
from nerserve.service.engine import LocalEngine
from nerserve.service.engine_link import EngineAddress, RemoteEngine
from nerserve.service.interpreter import settle_collector
from nerserve.service.metrics import ResponseRecorder
from nerserve.service.models import decoder_loop_length, load_served_model, model_names
from nerserve.service.request_encoding import RequestEncoding
from nerserve.service.request_ids import RequestIds, request_id_of
from nerserve.service.start_up_exports import Exporter
from nerserve.service.tenants import Tenants, read_api_keys

log = logging.getLogger("nerserve")


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
# add memory (an export holds a torch copy of its model). The cores this process may use, not
# the machine's: a pod of one CPU on a many-core node loads one model at a time.
LOADING_LANES = max(1, min(4, usable_cores()))


async def _load_models(state: ServiceState) -> None:
    try:
        names = loading_order(state)
    except Exception as error:
        log.error("cannot serve: %s: %s", type(error).__name__, error)
        _stop_serving(state, f"{type(error).__name__}: {error}")
        return
    state.model_states = dict.fromkeys(names, "loading")
    first, *others = names
    await _load_model(state, first, background=False)
    lanes = asyncio.Semaphore(LOADING_LANES)

    async def load_in_background(name: str) -> None:
        async with lanes:
            await _load_model(state, name, background=True)

    await asyncio.gather(*(load_in_background(name) for name in others))
    if not state.models and state.fatal is None and not state.draining:
        _stop_serving(state, "no model could be loaded: " + "; ".join(f"{n}: {e}" for n, e in state.model_errors.items()))


async def _load_model(state: ServiceState, name: str, background: bool) -> None:
    if state.fatal is not None or state.draining:  # stopping: another model's failure, or a signal
        return
    try:
        log.info("loading %s (%s)", name, state.settings.runtime.value)
        model = await asyncio.to_thread(
            load_served_model,
            name,
            state.settings,
            state.metrics,
            state.exports,
            background,
            state.tenants.weight,
            functools.partial(_model_broke, state, name),
            state.batch_log,
        )
        model.scheduler.start()
    except Exception as error:
        state.model_states[name] = "failed"
        state.model_errors[name] = f"{type(error).__name__}: {error}"
        if state.draining:
            # Asked to stop while it loaded: a signal sent to the whole process group (Ctrl-C in a
            # terminal, `timeout`, systemd's control-group stop) ends its export at the same moment;
            # a stop, not a failure to report as the exit status.
            log.info("model %s not loaded: the server is stopping (%s)", name, state.model_errors[name])
            return
        log.error("model %s failed to load: %s", name, state.model_errors[name])
        if state.settings.on_model_error == "exit" and state.fatal is None:
            _stop_serving(state, f"model {name!r} failed to load: {state.model_errors[name]}")
        return
    state.models[model.name] = model
    state.views[model.name] = model.view()
    state.model_states[name] = "ready"
    settle_collector()  # what loading made lives as long as the process
    state.ready = True  # readiness: at least one model (the default first) answers
    log.info("ready: %s", name)


def _model_broke(state: ServiceState, name: str, reason: str) -> None:
    """A served model's graphs stopped working (Scheduler.probe): it answers 503 from now on. With
    on_model_error=exit, or no model left that answers, the process stops, non-zero, for its
    supervisor (Kubernetes, the container's restart policy) to start it afresh."""
    state.model_states[name] = "broken"
    state.model_errors[name] = reason
    log.error("model %s stopped working while serving: %s", name, reason)
    if state.fatal is not None:
        return
    still_serving = any(other in ("ready", "loading") for other in state.model_states.values())
    if state.settings.on_model_error == "exit" or not still_serving:
        _stop_serving(state, f"model {name!r} stopped working while serving: {reason}")


def _stop_serving(state: ServiceState, reason: str) -> None:
    """The process cannot serve: liveness fails from now on, and a graceful stop follows (what was
    admitted is answered), after which run() exits non-zero naming REASON."""
    state.fatal = reason
    os.kill(os.getpid(), signal.SIGTERM)


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
    ("" when none); answers an unhandled exception as a JSON 500 naming the request's id, which
    its log line names too."""

    def __init__(self, app: ASGIApp, record: ResponseRecorder) -> None:
        self.app = app
        self.record = record

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
            request_id = request_id_of(scope)
            log.exception("unhandled error answering %s %s (request id %s)", scope.get("method"), scope.get("path"), request_id)
            if status is None:
                message = f"internal error (request id {request_id})"
                await error_response("internal", message, path=scope["path"])(scope, receive, watching_send)
        finally:
            model = str(scope.get("state", {}).get("model", ""))
            self.record(model, status or 500, key_name(scope), time.perf_counter() - started)


def api_keys(settings: Settings) -> Tenants:
    return Tenants(read_api_keys(settings.api_keys, settings.api_keys_file))


def new_state(settings: Settings, exporter: Exporter | None = None) -> ServiceState:
    """The service's state, its API keys read (said at start-up, never the keys themselves)."""
    state = ServiceState(settings, tenants=api_keys(settings), exporter=exporter)
    if state.tenants.enabled:
        names = ", ".join(state.tenants.names())
        log.info("API keys: %d (%s); /health, /info and the docs stay open", len(state.tenants.keys), names)
    else:
        log.info("API keys: none configured: every route is open")
    return state


async def shut_down(state: ServiceState, loader: asyncio.Task[None]) -> None:
    """Draining: what was admitted is answered (within the drain deadline), then the models close."""
    state.draining = True
    loader.cancel()
    # a model still exporting must not hold the process: stopped while the others drain
    exports_stopped = asyncio.create_task(asyncio.to_thread(state.exports.stop))
    for model in state.models.values():
        await model.scheduler.drain(state.settings.drain_seconds)
        await model.scheduler.stop()
        await asyncio.to_thread(model.close)
    await exports_stopped


def create_app(
    settings: Settings | None = None, exporter: Exporter | None = None, engine: EngineAddress | None = None
) -> FastAPI:
    """The app; `exporter`: how graphs missing at start-up are exported (the command line gives its
    own; without one, a model without graphs fails to load, saying so). With `engine` (the engine
    process's address) the app is an HTTP worker's: the models run in the engine process, which
    this app mirrors and asks (service.engine_link)."""
    settings = settings or Settings()
    if engine is None:
        state = new_state(settings, exporter)
        state.engine = LocalEngine(state)
    else:
        state = ServiceState(settings, tenants=api_keys(settings))
        state.engine = RemoteEngine(engine, state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if isinstance(state.engine, RemoteEngine):
            await state.engine.connect()
            settle_collector()  # the worker's start-up objects likewise
            yield
            state.draining = True
            await state.engine.close()
            return
        loader = asyncio.create_task(_load_models(state))
        if settings.load_before_serving:
            await asyncio.shield(loader)
        yield
        await shut_down(state, loader)

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
    app.add_middleware(Lanes)  # innermost: the extraction routes' usual requests, past FastAPI's dispatch
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(RequestEncoding, limit=settings.max_body_bytes)  # a compressed body decompressed first
    app.add_middleware(CountResponses, record=state.engine.record)  # sees every response the app makes
    return app


def door(state: ServiceState) -> Door:
    return Door(state.tenants, state.engine.record, state.settings.protect_metrics)


def with_admission(app: FastAPI) -> ASGIApp:
    """The application as served: request ids and the access log outermost (service.request_ids),
    then CORS (when origins are allowed), the API-key door and the edge admission, outside
    everything else."""
    state: ServiceState = app.state.service
    served: ASGIApp = KeyAuth(EdgeAdmission(app, state.engine, state.engine.record), door(state))
    if state.settings.cors_allow_origins:
        served = CORSMiddleware(
            served,
            allow_origins=state.settings.cors_allow_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["retry-after", "x-queue-time", "x-inference-time", "x-request-id"],
        )
    return RequestIds(served, state.settings.access_log)
