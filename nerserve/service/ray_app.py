"""The same FastAPI app as `nerserve serve`, as a Ray Serve deployment (`nerserve serve-ray`,
`pip install nerserve[ray]`): every replica builds its own app (models, pipeline, batcher) in its
own process, loads its models before Ray routes requests to it, says which replica answered in
`X-Replica`, and drains its batchers when Ray stops it (graceful_shutdown_timeout_s). Replicas are
a fixed count or autoscaled on requests in flight per replica (Ray's queue-length signal).
Locally by default; on an existing cluster with `--address` (the model store and graph cache must
then be reachable at the same paths on every node: a shared volume)."""

from __future__ import annotations

import signal
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nerserve.service.config import Settings
from nerserve.service.main import create_app, with_admission
from nerserve.service.start_up_exports import Exporter


class ReplicaHeader:
    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.replica = app, replica.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-replica", self.replica)]
            await send(message)

        await self.app(scope, receive, tagged if scope["type"] == "http" else send)


@serve.ingress()
class NerServeReplica:
    def __init__(self, settings: Settings, exporter: Exporter | None) -> None:
        # one process a replica: Ray's router is its front
        self.settings = settings.model_copy(update={"load_before_serving": True, "http_workers": 1})
        self.exporter = exporter
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.service_app: Any = None

    def __serve_build_asgi_app__(self) -> ASGIApp:
        self.service_app = create_app(self.settings, self.exporter)
        self.service_app.add_middleware(ReplicaHeader, replica=self.replica)
        return with_admission(self.service_app)

    def check_health(self) -> None:
        """Ray's health check: a replica whose process cannot serve is replaced."""
        state = self.service_app.state.service if self.service_app is not None else None
        if state is not None and state.fatal:
            raise RuntimeError(state.fatal)


def scaling(
    replicas: int | None = None, min_replicas: int = 1, max_replicas: int | None = None, target_in_flight: float = 16.0
) -> dict[str, Any]:
    if max_replicas is None:
        return {"num_replicas": replicas or 1}
    return {
        "autoscaling_config": {
            "min_replicas": min_replicas,
            "initial_replicas": max(min_replicas, replicas or min_replicas),
            "max_replicas": max_replicas,
            "target_ongoing_requests": target_in_flight,
        }
    }


def application(
    settings: Settings, exporter: Exporter | None = None, cpus_per_replica: float = 1.0, **scale: Any
) -> Application:
    """Replicas get the driver's settings (its folders, absolute; its API keys) and exporter."""
    deployment = serve.deployment(
        name="nerserve",
        ray_actor_options={"num_cpus": cpus_per_replica},
        graceful_shutdown_timeout_s=settings.drain_seconds,
        health_check_period_s=5,
        max_ongoing_requests=max(64, settings.batch_size_bound * 4),
        **scaling(**scale),
    )(NerServeReplica)
    return deployment.bind(settings, exporter)


def run_on_ray(
    settings: Settings, exporter: Exporter | None, address: str | None, cpus_per_replica: float, **scale: Any
) -> None:
    """On a local Ray started here: serve until SIGTERM / Ctrl-C, then drain and stop it. On an
    existing cluster (`address`): deploy, and leave the application to the cluster."""
    import ray

    ray.init(address=address, include_dashboard=False)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    app = application(settings, exporter, cpus_per_replica, **scale)
    if address:
        serve.run(app, name="nerserve", route_prefix="/")
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.run(app, name="nerserve", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()  # each replica drains its batchers (graceful_shutdown_timeout_s)
        ray.shutdown()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
