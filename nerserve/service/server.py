"""`nerserve serve`: one process (the HTTP front and the engine together, the default), or with
`--http-workers N` (N ≥ 2) an engine process and N HTTP worker processes.

The engine process (this one: the one Kubernetes signals) loads the models and owns the
schedulers, admission's count, the API keys' ceilings and the metrics; it checks that the port is
free and starts the workers, each listening on that port with a socket of its own (the kernel
hands each new connection to one of them), which ask the engine over a Unix socket
(service.engine_link). A worker that dies is
replaced. On SIGTERM the engine marks itself draining (every worker's readiness goes off), tells
the workers to stop (each stops accepting and answers what it admitted, within the drain deadline),
waits for them, drains its own queues and exits 0."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

import uvicorn
from fastapi import FastAPI

from nerserve.ner.runtime import DeviceUnavailable, resolve_device
from nerserve.service.api.state import ServiceState
from nerserve.service.config import Settings
from nerserve.service.engine import LocalEngine
from nerserve.service.engine_link import EngineAddress, EngineServer
from nerserve.service.http_protocol import HeaderDeadlineProtocol
from nerserve.service.interpreter import hand_over_quickly
from nerserve.service.logs import configure_logging
from nerserve.service.main import _load_models, create_app, door, new_state, shut_down, with_admission
from nerserve.service.start_up_exports import Exporter
from nerserve.service.tenants import ApiKeysError, read_api_keys

log = logging.getLogger("nerserve")
BACKLOG = 2048  # uvicorn's default
SUPERVISE_SECONDS = 0.5  # how often the engine looks for a worker that died


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


def run(settings: Settings, exporter: Exporter | None = None) -> None:
    configure_logging(settings.log_format, "engine" if settings.front_workers > 1 else "")
    hand_over_quickly(settings.interpreter_switch_ms)
    try:  # before anything is exported or loaded: keys or a device that cannot be used end the process at once
        read_api_keys(settings.api_keys, settings.api_keys_file)
        device = resolve_device(settings.device, settings.runtime.value, settings.precision)
    except (ApiKeysError, DeviceUnavailable) as error:
        raise SystemExit(f"nerserve: {error}") from None
    if device != settings.device:
        log.info("--device %s: running on %s", settings.device, device)
        settings = settings.model_copy(update={"device": device})
    # the count decided once, here, for every process of this server
    settings = settings.model_copy(update={"http_workers": settings.front_workers})
    if settings.front_workers > 1:
        settings = settings.model_copy(update={"port": free_port_or_exit(settings.host, settings.port)})
        log.info("listening on %s (%d HTTP worker processes)", _url(settings.host, settings.port), settings.front_workers)
        with asyncio.Runner(loop_factory=engine_loop_factory()) as runner:
            fatal = runner.run(_engine_process(settings, exporter))
    else:
        # bound here, before anything loads: an address that cannot be listened on ends the process
        # saying which, and an IPv6 one takes both families ("::" takes IPv4 too; asyncio's own bind
        # of it, uvicorn's, takes IPv6 only)
        sockets = [listening_socket(settings.host, settings.port)]
        log.info("listening on %s", _url(settings.host, int(sockets[0].getsockname()[1])))
        app = create_app(settings, exporter)
        _serve(app, settings, sockets)
        fatal = app.state.service.fatal
    if fatal:
        raise SystemExit(f"nerserve: {fatal}")


def engine_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The engine process's event loop: the workers' (uvicorn's choice, libuv's where installed),
    since its per-request Python is what caps the workers' requests/s and it shares the graphs'
    cores. The config only names that loop; its app is never loaded."""
    return uvicorn.Config(with_admission).get_loop_factory()


def _serve(app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None) -> None:
    state: ServiceState = app.state.service
    HeaderDeadlineProtocol.header_timeout = settings.header_timeout_seconds
    HeaderDeadlineProtocol.record = state.engine.record
    HeaderDeadlineProtocol.door = door(state)
    HeaderDeadlineProtocol.logs_access = settings.access_log
    engine = state.engine  # with the engine in this process (not an HTTP worker's link to it), and no CORS headers owed
    HeaderDeadlineProtocol.edge = engine.edge if isinstance(engine, LocalEngine) and not settings.cors_allow_origins else None
    config = uvicorn.Config(
        with_admission(app),
        host=settings.host,
        port=settings.port,
        http=HeaderDeadlineProtocol,
        timeout_graceful_shutdown=int(settings.drain_seconds) or None,
        log_config=None,  # uvicorn's lines in the server's own format (service.logs)
        log_level="info",
        access_log=False,  # the server's own access log, with request ids (service.request_ids)
        backlog=BACKLOG,
    )
    DrainingServer(config, state).run(sockets=sockets)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if _family(host) == socket.AF_INET6 else f"http://{host}:{port}"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _socket(host: str) -> socket.socket:
    """A socket for HOST's family; an IPv6 one takes IPv4 too (as "::" means every interface)."""
    sock = socket.socket(_family(host))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    return sock


def listening_socket(host: str, port: int) -> socket.socket:
    """The one-process server's socket, bound: a port in use, or a kernel without IPv6 for "::",
    ends the process, saying so."""
    sock: socket.socket | None = None
    try:
        sock = _socket(host)
        sock.bind((host, port))
    except OSError as error:
        if sock is not None:
            sock.close()
        raise SystemExit(f"nerserve: cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def free_port_or_exit(host: str, port: int) -> int:
    """The port the workers will share, checked free by binding it alone (without SO_REUSEPORT, so
    that a port another server holds is an error here even if that server shares its own), then
    let go for them; port 0 becomes the one the system picked."""
    with listening_socket(host, port) as probe:
        return int(probe.getsockname()[1])


def worker_socket(host: str, port: int) -> socket.socket:
    """An HTTP worker's own listening socket on the port all workers share (SO_REUSEPORT): the
    kernel spreads new connections over the workers by a hash of their addresses. Workers that
    accepted on one shared socket took connections as they woke, and a burst (a load balancer's
    pool of keep-alive connections) could land on one worker and leave the others idle; a worker
    that stops (drains, dies) takes its socket with it, and new connections go to the others."""
    sock = _socket(host)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def http_worker(settings: Settings, engine: EngineAddress, index: int) -> None:
    """An HTTP worker process's life: the app in front of the engine at `engine`."""
    configure_logging(settings.log_format, f"http-{index}")
    hand_over_quickly(settings.interpreter_switch_ms)
    _serve(create_app(settings, engine=engine), settings, [worker_socket(settings.host, settings.port)])


async def _engine_process(settings: Settings, exporter: Exporter | None) -> str | None:
    """The engine process's life and its workers'; returns why it could not serve, if so."""
    try:
        folder = tempfile.mkdtemp(prefix="nerserve-engine-")  # 0700: only this user reaches the engine
    except OSError as error:  # a read-only root filesystem with nothing writable mounted at /tmp
        return (
            f"the HTTP workers reach the engine through a socket in a temporary folder, and none could be made "
            f"({error}): mount a writable folder at /tmp (or set TMPDIR to one), or serve with --http-workers 1"
        )
    state = new_state(settings, exporter)
    engine = LocalEngine(state)
    state.engine = engine
    address = EngineAddress(os.path.join(folder, "engine.sock"), os.getpid())
    link = EngineServer(engine)
    await link.start(address.path)
    loader = asyncio.create_task(_load_models(state))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def asked_to_stop() -> None:
        state.draining = True  # at once: a load failing from the same signal is then a stop (main._load_model)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, asked_to_stop)
    spawn = multiprocessing.get_context("spawn")

    def start(index: int) -> BaseProcess:
        process = spawn.Process(target=http_worker, args=(settings, address, index), name=f"nerserve-http-{index}")
        process.start()
        return process

    workers = [start(index) for index in range(settings.front_workers)]
    log.info("engine process %d; HTTP workers %s on %s:%d", os.getpid(), [w.pid for w in workers], settings.host, settings.port)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), SUPERVISE_SECONDS)
        except TimeoutError:
            for index, worker in enumerate(workers):
                if not worker.is_alive():
                    log.error("HTTP worker %d (pid %s) exited with %s: starting another", index, worker.pid, worker.exitcode)
                    workers[index] = start(index)
    state.draining = True
    link.publish()  # every worker's readiness off before any stops accepting
    for worker in workers:
        if worker.is_alive() and worker.pid is not None:
            os.kill(worker.pid, signal.SIGTERM)
    await asyncio.to_thread(_join, workers, settings.drain_seconds + 5)
    await shut_down(state, loader)
    await link.close()
    shutil.rmtree(folder, ignore_errors=True)
    return state.fatal


def _join(workers: list[BaseProcess], seconds: float) -> None:
    """Workers answer what they admitted within the drain deadline; one that does not is killed."""
    deadline = time.monotonic() + seconds
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            log.error("HTTP worker %s did not stop within %.0f s: killed", worker.pid, seconds)
            worker.kill()
            worker.join()
