"""benchmarks/interpreter_profile.py reads py-spy's raw recordings of a server as the GPU check takes
them (--subprocesses --gil --threads): each process by its role, its threads, its functions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "interpreter_profile.py"
ENGINE = 'process 100:"python -m nerserve serve --http-workers 2"'
# a spawned child's command line holds the frames' separator
WORKER = 'process 101:"python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=16)"'
LOOP = "thread (100): MainThread;Runner.run (asyncio/runners.py:118)"
LANE = "thread (105): graphs_1;GraphLanes._main (nerserve/service/batching/lanes.py:135)"
WORKER_LOOP = "thread (101): MainThread;http_worker (nerserve/service/server.py:150)"
RECORDING = "\n".join(
    [
        f"{ENGINE};{LOOP};EngineServer._serve (nerserve/service/engine_link.py:230);frame (engine_link.py:79) 30",
        f"{ENGINE};{LOOP};Scheduler._collect_loop (nerserve/service/batching/scheduler.py:691) 10",
        f"{ENGINE};{LANE};EagerGraph.run (nerserve/ner/torch_graph.py:90);Module._call_impl (torch/nn/modules/module.py:1) 40",
        f"{ENGINE};{LANE};EagerGraph.run (nerserve/ner/torch_graph.py:91) 20",
        f"{ENGINE};{WORKER};{WORKER_LOOP};answer (nerserve/service/api/extraction.py:400) 50",
    ]
)


def test_a_recording_is_read_by_process_thread_and_function(tmp_path: Path) -> None:
    recording = tmp_path / "profile.txt"
    recording.write_text(RECORDING + "\n")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(recording), "--rate", "100", "--seconds", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    processes = {p["role"]: p for p in json.loads(result.stdout)["processes"]}
    assert set(processes) == {"engine", "http worker"}
    engine, worker = processes["engine"], processes["http worker"]
    # 100 samples of the engine's lock in 1 s at 100 a second: held all the time; the worker half
    assert (engine["interpreter_busy"], worker["interpreter_busy"]) == (1.0, 0.5)
    assert engine["pids"] == [100] and worker["pids"] == [101]
    threads = {t["thread"]: t for t in engine["threads"]}
    assert [t["thread"] for t in engine["threads"]] == ["graphs", "MainThread"]  # the lanes together, by name
    assert (threads["graphs"]["share"], threads["MainThread"]["share"]) == (0.6, 0.4)
    own = {row["function"]: row["share"] for row in engine["own_time"]}
    assert own["Module._call_impl (torch/nn/modules/module.py)"] == 0.4
    assert own["EagerGraph.run (nerserve/ner/torch_graph.py)"] == 0.2  # its lines as one function
    lane = {row["function"]: row["share"] for row in threads["graphs"]["with_callees"]}
    loop = {row["function"]: row["share"] for row in threads["MainThread"]["with_callees"]}
    # a thread's start is left out down to the deepest frame all its samples share, where its work is
    assert lane == {"EagerGraph.run (nerserve/ner/torch_graph.py)": 0.6, "Module._call_impl (torch/nn/modules/module.py)": 0.4}
    assert loop["Runner.run (asyncio/runners.py)"] == 0.4
    assert loop["EngineServer._serve (nerserve/service/engine_link.py)"] == 0.3
    assert [t["thread"] for t in worker["threads"]] == ["MainThread"]
