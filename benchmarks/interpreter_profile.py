"""Who holds each of a running server's interpreter locks, from a py-spy recording: for the engine
process and its HTTP workers (and a graph process, where there is one), how much of the time a
thread held the lock, which threads (the event loop, prepare, the graph lanes, decode), and the
functions it was in, by their own time and with what they called.

A served pass on a GPU waits for the engine's interpreter: eager torch launches each kernel from
Python, beside the loop answering requests, the next batch's prepare and the last one's decode;
what a card's engine spends its CPU on is what this says (docs/gpu.md). Sampled with `--gil`, a
sample is the thread holding the lock at that moment, so a process's share is how busy its
interpreter was.

    py-spy record --pid SERVER_PID --subprocesses --gil --threads --rate 250 --duration 5 \
        --format raw -o profile.txt
    python benchmarks/interpreter_profile.py profile.txt --rate 250 --seconds 5 > profile.json
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import takewhile
from pathlib import Path
from typing import Annotated, Any

import typer

# a process's command line may hold `;`, the frames' separator
PROCESS = re.compile(r'process (\d+):"[^"]*";')
THREAD = re.compile(r"^thread \(\d+\): (.*)$")
LINE_NUMBER = re.compile(r":\d+\)$")
TOP = 25  # functions listed: a process's by own time, a thread's with their callees

app = typer.Typer(add_completion=False)


@dataclass
class Thread:
    samples: int = 0
    within: Counter[str] = field(default_factory=Counter)  # every frame on a sample's stack, once
    common: list[str] | None = None  # the frames every sample's stack starts with

    def add(self, code: list[str], samples: int) -> None:
        self.samples += samples
        self.within.update(dict.fromkeys(code, samples))
        if self.common is None:
            self.common = code
        else:  # zip stops at the shorter: the common start is never longer
            self.common = [a for a, _ in takewhile(lambda pair: pair[0] == pair[1], zip(self.common, code, strict=False))]

    def callees(self) -> Counter[str]:
        """`within` less the thread's start (the frames every sample starts with), down to the
        deepest of them, where its work is (a lane's pass, the loop's run)."""
        start = set((self.common or [])[:-1])
        return Counter({frame: n for frame, n in self.within.items() if frame not in start})


@dataclass
class Process:
    pid: int
    samples: int = 0
    threads: dict[str, Thread] = field(default_factory=lambda: defaultdict(Thread))
    own: Counter[str] = field(default_factory=Counter)  # the frame a sample was in
    roles: set[str] = field(default_factory=set)


def role(process: Process, root: int) -> str:
    if process.pid == root:
        return "engine"
    if "http worker" in process.roles:
        return "http worker"
    if "graph process" in process.roles:
        return "graph process"
    return "other"


def read(path: Path) -> tuple[dict[int, Process], int]:
    """Each process's samples (py-spy's raw format: frames root first, `;` apart, then a count),
    and the root process's id (the one every sample's stack starts from)."""
    processes: dict[int, Process] = {}
    root: int | None = None
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # a recording without --subprocesses names no process: the one recorded, here 0
        chain = [int(m.group(1)) for m in PROCESS.finditer(stack + ";")] or [0]
        root = root if root is not None else chain[0]
        process = processes.setdefault(chain[-1], Process(chain[-1]))
        frames = PROCESS.sub("", stack + ";").rstrip(";").split(";")
        thread = next((m.group(1) for m in map(THREAD.match, frames) if m), "")
        code = [LINE_NUMBER.sub(")", f) for f in frames if f and not THREAD.match(f)]
        samples = int(count)
        process.samples += samples
        # graphs_0 and graphs_1 (a graph process's lane-0, lane-1): the lanes together
        process.threads[re.sub(r"[-_]\d+$", "", thread)].add(code, samples)
        if code:
            process.own[code[-1]] += samples
        if any(f.startswith("http_worker (") for f in code):
            process.roles.add("http worker")
        if any("graph_process.py" in f for f in code):
            process.roles.add("graph process")
    return processes, root or 0


def shares(counts: Counter[str], total: int, top: int) -> list[dict[str, Any]]:
    return [{"function": name, "share": round(n / total, 4)} for name, n in counts.most_common(top)]


def summary(processes: dict[int, Process], root: int, rate: float, seconds: float) -> dict[str, Any]:
    """By role (processes of one role together): how busy one's interpreter was, its functions by
    their own time, and each thread's share with the functions it spent it in."""
    by_role: dict[str, list[Process]] = defaultdict(list)
    for process in processes.values():
        by_role[role(process, root)].append(process)
    out: dict[str, Any] = {"rate": rate, "seconds": seconds, "processes": []}
    for name, group in sorted(by_role.items()):
        samples = sum(p.samples for p in group)
        own: Counter[str] = Counter()
        threads: dict[str, tuple[int, Counter[str]]] = {}
        for p in group:
            own.update(p.own)
            for thread_name, thread in p.threads.items():
                count, callees = threads.get(thread_name, (0, Counter[str]()))
                threads[thread_name] = (count + thread.samples, callees + thread.callees())
        out["processes"].append(
            {
                "role": name,
                "count": len(group),
                "pids": sorted(p.pid for p in group),
                # the share of the time one such process's interpreter was held (their mean)
                "interpreter_busy": round(samples / len(group) / (rate * seconds), 4),
                "own_time": shares(own, samples, TOP),
                "threads": [
                    {"thread": thread_name, "share": round(count / samples, 4), "with_callees": shares(callees, samples, TOP)}
                    for thread_name, (count, callees) in sorted(threads.items(), key=lambda item: -item[1][0])
                ],
            }
        )
    return out


@app.command()
def main(
    recording: Annotated[Path, typer.Argument(help="py-spy's raw output (--format raw)")],
    rate: Annotated[float, typer.Option(min=1.0, help="py-spy's --rate")] = 250.0,
    seconds: Annotated[float, typer.Option(min=0.1, help="py-spy's --duration")] = 5.0,
) -> None:
    processes, root = read(recording)
    if not processes:
        raise SystemExit(f"{recording}: no samples")
    typer.echo(json.dumps(summary(processes, root, rate, seconds), indent=2))


if __name__ == "__main__":
    app()
