"""The application: lifespan (load models in the background, warm up, drain on shutdown), error
handlers, body-size limit, and `run()` for `nerserve serve`."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import (
    ApiError,
    api_error_handler,
    error_response,
    http_error_handler,
    validation_error_handler,
)
from service.api.routes import ServiceState, router
from service.config import Settings
from service.models import load_served_model, model_names

log = logging.getLogger("nerserve")
WARMUP = [["Warm", "up", "sentence", "for", "the", "graphs", "."]]


async def _load_models(state: ServiceState) -> None:
    try:
        for name in model_names(state.settings):
            log.info("loading %s (%s)", name, state.settings.runtime.value)
            model = await asyncio.to_thread(load_served_model, name, state.settings, state.metrics)
            await asyncio.to_thread(model.program.predict, WARMUP)
            model.scheduler.start()
            state.models[model.name] = model
        state.ready = True
        log.info("ready: %s", ", ".join(state.models))
    except Exception as error:  # reported on /health/ready; the process stays up for inspection
        state.load_error = f"{type(error).__name__}: {error}"
        log.error("model loading failed: %s", state.load_error)


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
            await error_response("payload_too_large", message)(scope, receive, send)
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


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    state = ServiceState(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(_load_models(state))
        yield
        state.draining = True
        loader.cancel()
        for model in state.models.values():
            await model.scheduler.drain(settings.drain_seconds)
            await model.scheduler.stop()

    app = FastAPI(
        title="nerserve",
        version="0.1.0",
        summary="Flat, nested and discontinuous named entity recognition",
        lifespan=lifespan,
    )
    app.state.service = state
    app.include_router(router)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app


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


def run(settings: Settings) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        timeout_graceful_shutdown=int(settings.drain_seconds) or None,
        log_level="info",
    )
    DrainingServer(config, app.state.service).run()
