"""A model's graphs in a process of their own: batches go over, the arrays decoding reads come
back; a failure there is a GraphError here, never a hang. And a real server with --graph-process
answers as the one-process server does, and exits cleanly on SIGTERM; when a model's graph process
dies, its requests are refused saying so, and the server stops (or, told to skip failed models,
serves the others on)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from nerserve.ner.graph import GraphError
from nerserve.ner.runtime.simulated import simulated_device
from nerserve.service.config import Settings
from nerserve.service.graph_process import GraphProcess
from tests.serving import Server, assert_same_results, spawned_children


class Doubling:
    """A program whose graphs double their input; a kept value (not an array) stays behind."""

    graphs: dict[str, object] = {}  # noqa: RUF012 - no graphs to report

    def run(self, batch: np.ndarray, options: list[Any]) -> dict[str, Any]:
        if options == ["fail"]:
            raise ValueError("a bad batch")
        if options == ["die"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"doubled": batch * 2, "on_device": object()}


def doubling() -> Doubling:
    return Doubling()


class Slow:
    """A program whose pass takes SLOW_PASS_SECONDS and answers the name of the child's thread that
    ran it, and the child's process id."""

    graphs: dict[str, object] = {}  # noqa: RUF012 - no graphs to report

    def run(self, batch: np.ndarray, options: list[Any]) -> dict[str, Any]:
        time.sleep(SLOW_PASS_SECONDS)
        return {"lane": np.array([threading.current_thread().name]), "pid": np.array([os.getpid()])}


SLOW_PASS_SECONDS = 0.5


def slow() -> Slow:
    return Slow()


def mark_lane() -> None:
    """A lane's set-up, in the child's lane thread (on CUDA: a stream of its own)."""
    threading.current_thread().name += " set up"


def test_a_graph_process_runs_a_batch_a_lane_at_once() -> None:
    """Two lanes' batches run together in the child, each in its lane's thread, set up as it started;
    with one lane they run one after the other. Dealt out over two processes, two lanes run one in
    each, together."""
    # four batches: two rounds, or four
    for lanes, processes, least, most in [(2, 1, 2.0, 3.0), (1, 1, 4.0, 5.5), (2, 2, 2.0, 3.0)]:
        graphs = GraphProcess("slow", slow, lanes=lanes, lane_setup=mark_lane, processes=processes)
        try:
            assert (graphs.lanes, graphs.processes) == (lanes, processes)
            with ThreadPoolExecutor(max_workers=4) as pool:
                started = time.monotonic()
                answers = list(pool.map(graphs.run, [(np.zeros(1), [None])] * 4))
                took = time.monotonic() - started
            assert least * SLOW_PASS_SECONDS <= took < most * SLOW_PASS_SECONDS, (lanes, processes, took)
            names = {str(answer["lane"][0]) for answer in answers}
            assert names == {f"lane-{i} set up" for i in range(lanes // processes)}
            assert len({int(answer["pid"][0]) for answer in answers}) == processes
            assert graphs.device_report() is None  # no simulated device in this child
        finally:
            graphs.close()


def test_more_graph_processes_than_lanes_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 graph processes for 2 lanes"):
        GraphProcess("slow", slow, lanes=2, processes=3)


class OnTheCard:
    """A program whose pass is a simulated device's pass of one sub-word (CARD_PASS_SECONDS on its table)."""

    graphs: dict[str, object] = {}  # noqa: RUF012 - no graphs to report

    def __init__(self, costs: Path) -> None:
        self.device = simulated_device(costs)

    def run(self, batch: np.ndarray, options: list[Any]) -> dict[str, Any]:
        self.device.run(1)
        return {"pid": np.array([os.getpid()])}


CARD_PASS_SECONDS = 0.3


def card_table(folder: Path, device_ms: float, host_ms: float | None = None) -> Path:
    """A simulated card whose pass costs DEVICE_MS on the device (and HOST_MS launching it) at any size."""
    costs = folder / "card.json"
    points = [{"subwords": n, "ms": device_ms, **({"host_ms": host_ms} if host_ms else {})} for n in (1, 100)]
    costs.write_text(json.dumps({"card": "one card", "source": "a test", "points": points}))
    return costs


def four_passes(graphs: GraphProcess) -> tuple[list[dict[str, Any]], float]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        started = time.monotonic()
        answers = list(pool.map(graphs.run, [(np.zeros(1), [None])] * 4))
        return answers, time.monotonic() - started


def test_the_graph_processes_of_a_model_wait_on_one_simulated_card(tmp_path: Path) -> None:
    """Two graph processes launch side by side, and their passes queue on one card, as processes'
    passes do on one GPU: four passes take four passes' time, not two, and the card's report, from
    either process, counts all four."""
    costs = card_table(tmp_path, CARD_PASS_SECONDS * 1000)
    graphs = GraphProcess("card", functools.partial(OnTheCard, costs), lanes=2, processes=2)
    try:
        answers, took = four_passes(graphs)
        assert len({int(answer["pid"][0]) for answer in answers}) == 2
        assert 4 * CARD_PASS_SECONDS <= took < 5.5 * CARD_PASS_SECONDS, took
        report = graphs.device_report()
        assert report is not None and report["card"] == "one card"
        assert report["passes"] == 4 and report["busy_seconds"] == pytest.approx(4 * CARD_PASS_SECONDS)
    finally:
        graphs.close()


def quarter_second_clock() -> Any:
    """A device clock (runtime.pass_clock) that says every pass took the device 0.25 s."""
    return lambda: lambda: 0.25


def two_passes(graphs: GraphProcess) -> float:
    stop = graphs.pass_clock()
    for _ in range(2):
        graphs.run((np.zeros(1), [None]))
    return stop()


def test_a_pass_through_the_graph_process_is_timed_in_the_child() -> None:
    """The scheduler's clock for a pass through the child (GraphProcess.pass_clock) is the time the
    child reports: its own lane's clock around the pass (0.5 s here), which counts neither the pipes
    nor this process's threads, or the device's clock where the child has one; a thread's clock
    counts only the passes that thread ran."""
    for clock_of, own in [(None, SLOW_PASS_SECONDS), (quarter_second_clock, 0.25)]:
        graphs = GraphProcess("slow", slow, clock_of=clock_of)
        try:
            stop = graphs.pass_clock()
            graphs.run((np.zeros(1), [None]))
            with ThreadPoolExecutor(max_workers=1) as elsewhere:  # two passes of its own meanwhile
                assert elsewhere.submit(two_passes, graphs).result() == pytest.approx(2 * own, abs=0.1)
            assert stop() == pytest.approx(own, abs=0.05)  # this thread's one pass
        finally:
            graphs.close()


def cannot_load() -> Doubling:
    raise FileNotFoundError("weights.safetensors")


def test_batches_cross_and_only_arrays_come_back() -> None:
    graphs = GraphProcess("doubling", doubling)
    try:
        outputs = graphs.run((np.arange(4), [None]))
        assert list(outputs) == ["doubled"] and outputs["doubled"].tolist() == [0, 2, 4, 6]
        with pytest.raises(GraphError, match="doubling: ValueError: a bad batch"):
            graphs.run((np.arange(2), ["fail"]))
        assert graphs.run((np.ones(1), [None]))["doubled"].tolist() == [2.0]  # a failed batch fails alone
        with pytest.raises(GraphError, match="the graph process ended"):
            graphs.run((np.arange(2), ["die"]))
        with pytest.raises(GraphError, match="the graph process ended"):
            graphs.device_report()  # its control pipe says so too (the engine then leaves it out of /info)
    finally:
        graphs.close()


def test_a_model_that_cannot_load_is_an_error_at_start() -> None:
    with pytest.raises(GraphError, match=r"could not load the model \(FileNotFoundError: weights.safetensors\)"):
        GraphProcess("broken", cannot_load)


def test_a_server_with_a_graph_process_answers_as_one_process_does() -> None:
    sentences = [["Peter", "Blackburn", "lives", "in", "Paris", "."], ["EU", "rejects", "German", "call", "."]]
    plain = Server(models='["span-conll03"]', threads=1)
    # its warm-up passes (one sentence, then a batch at the limits) go through the graph process
    limits = {"max_batch_size": 4, "max_batch_tokens": 256, "warm_up_at_batch_limits": "true"}
    # two graph processes, a lane each: the batches of either answer alike
    split = Server(models='["span-conll03"]', threads=1, graph_process="true", graph_processes=2, **limits)
    try:
        plain.wait_ready()
        split.wait_ready()
        assert len(spawned_children(split.process.pid)) == 2
        want = httpx.post(f"{plain.url}/extract", json={"tokens": sentences}, timeout=60).json()["results"]
        for _ in range(4):  # the lanes are taken in turn: each process's passes, alike
            got = httpx.post(f"{split.url}/extract", json={"tokens": sentences}, timeout=60).json()["results"]
            assert_same_results(got, want)
        info = httpx.get(f"{split.url}/info").json()
        assert (info["graph_processes"], info["batching"]["graph_lanes"]) == (2, 2)
        assert httpx.get(f"{plain.url}/info").json()["graph_processes"] == 0
        providers = info["execution_providers"]["span-conll03"]
        assert providers == {"encoder": "CPUExecutionProvider", "span_proposal": "CPUExecutionProvider"}  # the child's
        assert any(result["entities"] for result in got)
        warmed = {m["name"]: m["warm_up"] for m in httpx.get(f"{split.url}/models").json()["models"]}
        full = warmed["span-conll03"]["full_batch"]
        assert (full["sentences"], full["sentence_subwords"]) == (4, 64) and full["ms"] > 0
        plain_models = httpx.get(f"{plain.url}/models").json()["models"]
        assert plain_models[0]["warm_up"]["one_sentence_last_ms"] > 0 and plain_models[0]["warm_up"]["full_batch"] is None
    finally:
        plain.stop()
        split.stop()
    assert split.process.returncode == 0


SENTENCES = [["Peter", "Blackburn", "lives", "in", "Paris", "."]]


def extract(server: Server, model: str) -> httpx.Response:
    return httpx.post(f"{server.url}/extract", json={"model": model, "tokens": SENTENCES}, timeout=60)


def assert_stopped_working(response: httpx.Response) -> None:
    error = response.json()["error"]
    assert response.status_code == 503 and error["code"] == "model_failed", response.text
    assert "stopped working while serving" in error["message"] and "the graph process ended" in error["message"]


@pytest.mark.parametrize("processes", [1, 2])
def test_a_model_whose_graph_process_dies_is_refused_saying_so_and_the_server_stops(processes: int) -> None:
    """Graphs that stop working while serving (a graph process gone; on a GPU, a device in an error
    state alike) fail every pass: requests are answered 503 saying why, rather than a 500 each, and
    by default the process stops, non-zero, for its supervisor to start it afresh. One of two graph
    processes gone is the model's graphs gone, though the other would still answer some passes."""
    server = Server(models='["span-conll03"]', threads=1, graph_process="true", graph_processes=processes)
    try:
        server.wait_ready()
        assert extract(server, "span-conll03").status_code == 200
        children = spawned_children(server.process.pid)
        assert len(children) == processes
        os.kill(children[-1], signal.SIGKILL)
        for _ in range(processes):  # the lanes are taken in turn: the live child's pass may come first
            response = extract(server, "span-conll03")
            if response.status_code != 200:
                break
        assert_stopped_working(response)
        assert server.process.wait(60) != 0
        said = server.process.stderr.read().decode()  # type: ignore[union-attr]
        assert "model 'span-conll03' stopped working while serving" in said, said[-2000:]
    finally:
        server.stop()


def test_a_graph_process_that_hangs_is_found_out_and_the_server_stops() -> None:
    """A pass that never ends (here its process is stopped; on a GPU, a device that stopped
    answering) is noticed after --pass-timeout-seconds: its sentences are answered 503 rather than
    left waiting, and the process stops for its supervisor to start it afresh."""
    server = Server(models='["span-conll03"]', threads=1, graph_process="true", pass_timeout_seconds=2, drain_seconds=2)
    stopped: list[int] = []
    try:
        server.wait_ready()
        stopped += spawned_children(server.process.pid)
        os.kill(stopped[0], signal.SIGSTOP)
        started = time.monotonic()
        response = extract(server, "span-conll03")
        assert 2 <= time.monotonic() - started < 30
        assert response.status_code == 503 and "the device or the graph process hangs" in response.text, response.text
        assert server.process.wait(60) != 0
    finally:
        server.stop()
        for pid in stopped:  # the server kills it as it stops; should it not have
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_told_to_skip_failed_models_the_others_serve_on_until_none_is_left() -> None:
    server = Server(models='["span-conll03", "span-genia"]', threads=1, graph_process="true", on_model_error="skip")
    try:
        server.wait_ready()
        default, other = spawned_children(server.process.pid)  # the default model loads first, alone
        os.kill(default, signal.SIGKILL)
        assert_stopped_working(extract(server, "span-conll03"))
        assert_stopped_working(extract(server, "span-conll03"))  # refused before the batcher now
        assert extract(server, "span-genia").status_code == 200
        listed = {m["name"]: m for m in httpx.get(f"{server.url}/models").json()["models"]}
        assert listed["span-conll03"]["state"] == "broken" and "graph process ended" in listed["span-conll03"]["error"]
        assert listed["span-genia"]["state"] == "ready"
        assert httpx.get(f"{server.url}/health/ready").status_code == 200
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'nerserve_model_state{model="span-conll03",state="broken"} 1.0' in metrics
        assert 'nerserve_model_state{model="span-genia",state="ready"} 1.0' in metrics
        assert 'nerserve_model_state{model="span-genia",state="broken"} 0.0' in metrics
        os.kill(other, signal.SIGKILL)
        assert_stopped_working(extract(server, "span-genia"))
        assert server.process.wait(60) != 0  # no model left that answers
    finally:
        server.stop()


def test_graph_processes_are_settings_of_a_graph_process() -> None:
    """More than one graph process needs --graph-process and a lane for each; the lanes default to as many."""
    with pytest.raises(ValidationError, match="graph_processes 2 needs graph_process"):
        Settings(graph_processes=2)
    with pytest.raises(ValidationError, match="graph_processes 3 for graph_lanes 2: each graph process runs one lane or more"):
        Settings(graph_process=True, graph_processes=3, graph_lanes=2)
    assert Settings(graph_process=True, graph_processes=2).lanes == 2
    assert Settings(graph_process=True, graph_processes=4).lanes == 4
    assert Settings(graph_process=True, graph_processes=2, graph_lanes=4).lanes == 4


LAUNCH_SECONDS = 0.15


def test_passes_bound_by_their_launching_go_side_by_side_in_two_graph_processes(tmp_path: Path) -> None:
    """Where a pass is mostly the host launching it under the interpreter lock (eager torch on a GPU,
    as the simulated card's host_ms stands in for), a process's lanes launch one at a time, and two
    processes launch side by side: four passes take about four launches' time in one process of
    two lanes, about two in two processes of one."""
    costs = card_table(tmp_path, 10.0, LAUNCH_SECONDS * 1000)
    took = {}
    for processes in (1, 2):
        graphs = GraphProcess("card", functools.partial(OnTheCard, costs), lanes=2, processes=processes)
        try:
            _, took[processes] = four_passes(graphs)
        finally:
            graphs.close()
    assert took[1] >= 3.6 * LAUNCH_SECONDS, took
    assert took[2] < 0.75 * took[1], took  # about half where each child has a core to itself
