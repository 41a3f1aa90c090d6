"""A real nerserve process on 127.0.0.1 for tests (started with `python -m nerserve serve`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from nerserve.loadtest.client import parse_metrics
from nerserve.ner.graph_format import EXPORT_JSON, GraphFormat
from nerserve.ner.model_store import Locations

READY_TIMEOUT = 900  # first start exports the graphs
ROOT = Path(__file__).resolve().parent.parent
# the checkout's folders: those `nerserve` finds when run from its root, as the tests are
LOCATIONS = Locations(
    model_store=ROOT / "model_store", graph_cache=ROOT / "build" / "graphs", data_root=ROOT.parent / "shared" / "data"
)


def onnx_graphs(model: str) -> Path:
    """The checkout's fp32 ONNX graph set of a committed model, exported here where missing."""
    folder = LOCATIONS.graph_set_folder(model, "onnx")
    if not (folder / EXPORT_JSON).is_file():
        from nerserve.export.build import export_model

        source = LOCATIONS.model_dir(model)
        export_model(source, GraphFormat.onnx, LOCATIONS.graph_cache, LOCATIONS.data_root, log=lambda _: None)
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# What `python -c` runs to serve with some packages made unimportable (as if not installed)
BLOCKING = "import sys\nfor name in sys.argv[1:]: sys.modules[name] = None\nfrom nerserve.cli import app\napp(['serve'])"


def poll_ready(url: str, still_running: Callable[[], None], timeout: float, every: float = 0.5) -> bool:
    """GET {url}/health/ready until it answers 200 (True) or `timeout` passes (False);
    `still_running` raises when the server has died meanwhile."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        still_running()
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(every)
    return False


def spawned_children(pid: int) -> list[int]:
    """The children the process started with multiprocessing's spawn (HTTP workers, graph
    processes; not its resource tracker), from any of its threads, in the order they started."""
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            children += (task / "children").read_text().split()
    spawned = [int(child) for child in children if b"spawn_main" in _command_line(child)]
    # by start time, not by pid: pids wrap (at 32,768 on CI's machines), and a long test run wraps them
    return sorted(spawned, key=lambda child: (_start_ticks(child), child))


def _start_ticks(pid: int) -> int:
    """When PID started, in clock ticks since boot (/proc/PID/stat's 22nd field; the 2nd, the command's
    name in parentheses, may itself hold spaces)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except FileNotFoundError:  # ended meanwhile
        return 0
    return int(fields[19])


def _command_line(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # ended meanwhile
        return b""


class Server:
    def __init__(
        self,
        blocked: tuple[str, ...] = (),
        python: str = sys.executable,
        cwd: str | None = None,
        log: Path | None = None,
        own_process_group: bool = False,
        **settings: object,
    ) -> None:
        """LOG: a file for the server's log lines (standard error), for a server that logs much: a pipe
        nobody reads while it runs would fill and stop it. OWN_PROCESS_GROUP: the server leads a
        process group of its own (a session), which a test can signal whole, as a terminal does."""
        self.port = int(settings.pop("port", None) or free_port())  # type: ignore[call-overload]
        env = {**os.environ, **{f"NERSERVE_{k.upper()}": str(v) for k, v in settings.items()}}
        env["NERSERVE_PORT"] = str(self.port)
        command = [python, "-c", BLOCKING, *blocked] if blocked else [python, "-m", "nerserve", "serve"]
        self.log = log
        with log.open("wb") if log is not None else contextlib.nullcontext(subprocess.PIPE) as errors:
            self.process = subprocess.Popen(
                command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=own_process_group
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        end = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.logged()[-2000:]}")
            try:
                response = httpx.get(f"{self.url}/health/ready", timeout=2)
                states = response.json().get("models", {})
                # ready answers once the default model does; the tests want every model loaded
                if response.status_code == 200 and all(state != "loading" for state in states.values()):
                    return
                if response.json().get("status") == "failed":
                    raise RuntimeError(response.text)
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError("server not ready")

    def logged(self) -> str:
        """What the server has logged: its log file's lines so far, or (logging to a pipe) all of them
        once it has exited."""
        if self.log is not None:
            return self.log.read_text()
        return self.process.stderr.read().decode()  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


# Packing puts a sentence in a different row depending on what it is batched with, and the
# matrix products then sum in another order: scores may differ in the sixth decimal, nothing else.
SCORE_TOLERANCE = 1e-4


def assert_same_results(got: list[dict[str, object]], want: list[dict[str, object]]) -> None:
    """The same entities (types, offsets, text) in the same order, scores equal within SCORE_TOLERANCE."""
    assert [_without_scores(result) for result in got] == [_without_scores(result) for result in want]
    for got_scores, want_scores in zip(map(_scores, got), map(_scores, want), strict=True):
        assert all(abs(a - b) <= SCORE_TOLERANCE for a, b in zip(got_scores, want_scores, strict=True))


def _without_scores(result: dict[str, object]) -> dict[str, object]:
    entities = result["entities"]
    assert isinstance(entities, list)
    return {**result, "entities": [{k: v for k, v in entity.items() if k != "score"} for entity in entities]}


def _scores(result: dict[str, object]) -> list[float]:
    entities = result["entities"]
    assert isinstance(entities, list)
    return [float(entity["score"]) for entity in entities]


def dropped_as_gone(server: Server) -> float:
    metrics = parse_metrics(httpx.get(f"{server.url}/metrics").text)
    return metrics.get('nerserve_dropped_total{model="span-conll03",reason="client_gone"}', 0.0)


def assert_a_hang_up_leaves_its_sentences_unrun(server: Server, key: str | None = None) -> None:
    """A client that hangs up while its sentences wait: those not yet run are dropped (counted as
    client_gone), not run for nobody. The body (225 KiB) arrives faster than it is read, so uvicorn
    pauses reading on the way: the hang-up must still be seen once the body is read (the paused
    case alone: tests/test_http_protocol.py)."""
    words = ["Chancellorship", "Representatives", "Brussels", "Commission", "reported"] * 12
    body = json.dumps({"model": "span-conll03", "tokens": [words] * 256}).encode()
    before = dropped_as_gone(server)
    host, port = server.url.removeprefix("http://").split(":")
    head = ["POST /extract HTTP/1.1", f"host: {host}", "content-type: application/json", f"content-length: {len(body)}"]
    if key is not None:
        head.append(f"authorization: Bearer {key}")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)  # read and queued: 256 sentences of 60 words take seconds to run
    deadline = time.monotonic() + 30
    while dropped_as_gone(server) - before < 64 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert dropped_as_gone(server) - before >= 64
