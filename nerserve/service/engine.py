"""The engine: the one owner of the models, their schedulers (the fair queue), admission's count of
requests in flight, the API keys' ceilings and the metrics. The HTTP layer asks it through the
`Engine` interface: `LocalEngine` in the same process (one HTTP front, the default), or
`service.engine_link.RemoteEngine` from an HTTP worker process (`--http-workers N`), the split
vLLM makes between its API server and its engine core and TEI between its router and backend."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import generate_latest

from nerserve.ner.graph import GraphError
from nerserve.ner.runtime.simulated import SIMULATED, simulated_device
from nerserve.service.admission import EdgeCounter, Refusal
from nerserve.service.api.errors import ApiError
from nerserve.service.api.extraction import (
    Extraction,
    ExtractionQuery,
    OnDone,
    PlannedQuery,
    PlannedRun,
    UnitAnswers,
    extract,
    start_planned,
)
from nerserve.service.api.state import MODEL_STATES, ServiceState
from nerserve.service.graph_process import GraphProcess
from nerserve.service.metrics import ResponseRecord
from nerserve.service.models import ModelView, ServedModel


class Engine(Protocol):
    async def extract(self, model: str, query: ExtractionQuery, tenant: str, gone: asyncio.Future[Any]) -> Extraction:
        """Entities for a request to MODEL (its name resolved by the HTTP layer); `gone` is done
        when the client goes away. Refusals and bad input are ApiErrors."""
        ...

    async def admit(self, model: str | None, tenant: str, body_bytes: int | None) -> Refusal | None: ...

    def release(self) -> None: ...

    def record(self, model: str, status: int, tenant: str | None, seconds: float | None) -> None: ...

    async def metrics_text(self) -> bytes: ...

    async def stats(self) -> dict[str, Any]: ...

    async def device_report(self) -> dict[str, Any] | None:
        """The simulated device's card, busy seconds and passes (--device simulated), else None."""
        ...


@dataclass(frozen=True)
class EngineState:
    """What an HTTP worker mirrors of the engine: readiness, the models' states and facts."""

    ready: bool
    draining: bool
    fatal: str | None
    model_states: dict[str, str]
    model_errors: dict[str, str]
    views: dict[str, ModelView]

    @classmethod
    def of(cls, state: ServiceState) -> EngineState:
        return cls(
            state.ready, state.draining, state.fatal, dict(state.model_states), dict(state.model_errors), dict(state.views)
        )

    def apply(self, state: ServiceState) -> None:
        state.ready = self.ready
        state.draining = state.draining or self.draining  # a worker told to stop stays stopping
        state.fatal = self.fatal
        state.model_states = self.model_states
        state.model_errors = self.model_errors
        state.views = self.views


class LocalEngine:
    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self.edge = EdgeCounter(state.settings.max_queue_seconds, self._wait, self._open_requests)

    def _wait(self, model: str | None, pending: int, tenant: str) -> float | None:
        """Others' work a request not yet read would wait on: for the model its route names, or the
        least loaded model when the name is in the body (the scheduler then decides for the one it
        names)."""
        models = self.state.models
        if model is not None:
            named = models.get(model)
            return None if named is None else named.scheduler.edge_wait(pending, tenant).others
        return min((m.scheduler.edge_wait(pending, tenant).others for m in models.values()), default=None)

    def _open_requests(self) -> int:
        return sum([model.scheduler.open_requests for model in self.state.models.values()])

    def served(self, model: str) -> ServedModel:
        state = self.state
        served = state.models.get(model)
        if served is not None and state.model_states.get(model) == "ready":  # nearly every request
            return served
        state.model(model)  # still served (an HTTP worker resolved the name on its last view), else why not
        if served is None:
            raise ApiError("not_ready", f"model {model!r} is still loading", "model", headers={"Retry-After": "5"})
        return served

    async def extract(self, model: str, query: ExtractionQuery, tenant: str, gone: asyncio.Future[Any]) -> Extraction:
        return await extract(self.state, self.served(model), query, tenant, gone)

    def start_planned(
        self,
        model: str,
        query: PlannedQuery,
        tenant: str,
        on_done: OnDone,
        admitted: bool = True,
    ) -> PlannedRun:
        """A request an HTTP worker planned: its units into the model's batcher, `on_done` called
        with its answers or its error (refusals and bad input are raised here, as ApiErrors).
        `admitted`: let through the edge already; if not (a small body, which a worker sends with
        its run rather than ask first), it is weighed once, whole, at its model's queue with the
        requests let through ahead of it (what the edge would count), and counted until it is
        answered."""
        if admitted:
            return start_planned(self.state, self.served(model), query, tenant, on_done)
        edge = self.edge
        pending = edge.pending  # before this request counts as let through
        edge.let_through()

        def released(outcome: UnitAnswers | BaseException) -> None:
            edge.release()
            on_done(outcome)

        try:
            return start_planned(self.state, self.served(model), query, tenant, released, pending)
        except BaseException:
            edge.release()
            raise

    async def admit(self, model: str | None, tenant: str, body_bytes: int | None) -> Refusal | None:
        return await self.edge.admit(model, tenant, body_bytes)

    def release(self) -> None:
        self.edge.release()

    def record(self, model: str, status: int, tenant: str | None, seconds: float | None) -> None:
        self.state.metrics.record_response(model, status, tenant, seconds)

    def record_all(self, records: list[ResponseRecord]) -> None:
        """`record` for each of an HTTP worker's records of one turn."""
        self.state.metrics.record_responses(records)

    async def metrics_text(self) -> bytes:
        metrics = self.state.metrics
        metrics.admitted.set(self.edge.in_flight)
        for name, now in self.state.model_states.items():
            for state in MODEL_STATES:
                metrics.model_state.labels(name, state).set(float(state == now))
        for name, model in self.state.models.items():
            metrics.queue_depth.labels(name).set(model.scheduler.depth)
            metrics.in_flight.labels(name).set(model.scheduler.in_flight)
        return generate_latest(metrics.registry)

    async def stats(self) -> dict[str, Any]:
        """The papers' efficiency table, live: sentences/s and tokens/s per model over 10 s, 1 min
        and since start, mean batch size and padding ratio."""
        table: dict[str, Any] = {
            name: {
                **model.observer.stats.table(),
                "runtime": model.runtime,
                "precision": model.precision,
                "queue_depth": model.scheduler.depth,
            }
            for name, model in self.state.models.items()
        }
        if self.state.tenants.enabled:  # requests (by status), sentences and latency by API key name
            table["keys"] = self.state.metrics.by_key()
        return table

    async def device_report(self) -> dict[str, Any] | None:
        settings = self.state.settings
        if settings.device != SIMULATED:
            return None
        children = [model.graphs for model in self.state.models.values() if model.graphs is not None]
        if not children:
            return simulated_device(settings.simulated_device_costs).report()
        # the graph processes of a model wait on one simulated card of their own: a card a model, counted together
        reports = [report for child in children if (report := await asyncio.to_thread(_report_of, child))]
        if not reports:
            return None
        merged = dict(reports[0])
        merged["busy_seconds"] = round(sum(report["busy_seconds"] for report in reports), 6)
        merged["passes"] = sum(report["passes"] for report in reports)
        return merged


def _report_of(child: GraphProcess) -> dict[str, Any] | None:
    """A graph process's simulated device's report; none from one that is gone (its model is
    broken, and says so in /models)."""
    try:
        return child.device_report()
    except GraphError:
        return None
