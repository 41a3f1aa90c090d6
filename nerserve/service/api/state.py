"""What the HTTP layer knows of the running service: settings, the models' states and facts, and the
engine that runs them (in this process, or another one behind `--http-workers`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from nerserve.service.api.errors import ApiError
from nerserve.service.batch_log import BatchLog
from nerserve.service.config import Settings
from nerserve.service.metrics import Metrics
from nerserve.service.models import ModelView, ServedModel
from nerserve.service.start_up_exports import Exporter, StartUpExports
from nerserve.service.tenants import Tenants

if TYPE_CHECKING:
    from nerserve.service.engine import Engine


# the states of a model that cannot answer, as a refusal says them
FAILURES = {"failed": "failed to load", "broken": "stopped working while serving"}
MODEL_STATES = ("loading", "ready", *FAILURES)


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    models: dict[str, ServedModel] = field(default_factory=dict)  # the engine's own (none in an HTTP worker)
    views: dict[str, ModelView] = field(default_factory=dict)  # every loaded model's facts
    ready: bool = False  # at least one model answers
    draining: bool = False
    model_states: dict[str, str] = field(default_factory=dict)  # name → loading / ready / failed / broken
    model_errors: dict[str, str] = field(default_factory=dict)
    fatal: str | None = None  # the process cannot serve and is stopping (liveness fails)
    tenants: Tenants = field(default_factory=Tenants)  # API keys (none: every route open)
    exporter: Exporter | None = None  # how graphs missing at start-up are exported (none: they are an error)
    exports: StartUpExports = field(init=False)
    engine: Engine = field(init=False)  # set by the app: service.engine.LocalEngine or a RemoteEngine
    batch_log: BatchLog | None = field(init=False)  # --batch-log: every model's batches, one file

    def __post_init__(self) -> None:
        self.exports = StartUpExports(self.settings.locations, self.exporter)
        self.batch_log = BatchLog(self.settings.batch_log) if self.settings.batch_log else None

    @property
    def default_model(self) -> str | None:
        # The configured default when it is served; otherwise the first served model (GET /models
        # names the one in use), so a store without span-conll03 still answers model-less requests.
        if self.settings.default_model in self.views or self.model_states.get(self.settings.default_model or "") == "loading":
            return self.settings.default_model
        return next(iter(self.views), None)

    def model(self, name: str | None) -> ModelView:
        """The model a request names (or the default), if it can answer; else the error saying why."""
        chosen = name or self.default_model
        if chosen is not None and self.model_states.get(chosen) == "loading":
            raise ApiError("not_ready", f"model {chosen!r} is still loading", "model", headers={"Retry-After": "5"})
        failure = FAILURES.get(self.model_states.get(chosen or "", ""))
        if chosen is not None and failure is not None:
            raise ApiError("model_failed", f"model {chosen!r} {failure}: {self.model_errors[chosen]}", "model")
        if chosen is None or chosen not in self.views:
            known = ", ".join(self.views) or "none"
            raise ApiError("unknown_model", f"unknown model {chosen!r}; served models: {known}", "model")
        return self.views[chosen]


def service_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state
