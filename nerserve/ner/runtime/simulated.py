"""A simulated device: stands in for a GPU on the CPU, so that the engine around the device (batcher,
host work, pipelining, the HTTP front) can be measured where no GPU is.

Each graph set's graphs answer zeros of the shapes their export recorded, and the backbone graph
(the one fed packed sub-word rows) waits what a batch of that many sub-word positions cost on a
measured card, from a table of batch costs (`device_costs/*.json`: the card, where the figures were
measured, and the points). The wait is a sleep, which releases the GIL as a real device's
synchronisation does. A table's points may also say how much of a pass is the host launching it
(`host_ms`): eager torch on a GPU launches each kernel from Python, so a pass holds the interpreter
lock for that long, in competition with the event loop and the other lane, while the device runs
what has been launched. The stand-in spends that much of its thread's CPU time holding the lock, and
its pass ends when both the launching and the device's share are done.

Like a GPU's graphs the stand-ins are device-resident: outputs a program keeps on the device are
`DeviceZeros`, a shape and a type and no memory, that only other stand-in graphs read, so the
programs take their GPU paths (one span-proposal call a batch, no size groups on the host). Zeros
make decoding find nothing, so host decoding costs less than with real outputs; every figure taken
on this device is labelled simulated, never a GPU figure.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from nerserve.ner.graph import GraphError, Value
from nerserve.ner.runtime import OwnSeconds

SIMULATED = "simulated"
# the sub-word rows of the shared encoder: the batch's device work is sized by them
BACKBONE_INPUT = "input_ids"
DEFAULT_COSTS = "h100-minilm-l6.json"


@dataclass
class SimulatedDevice:
    """One card's batch costs, and how long it has been busy (one device per process, as a GPU)."""

    card: str
    source: str
    subwords: np.ndarray  # batch sizes in sub-word positions, increasing
    milliseconds: np.ndarray  # what a batch of that size cost the device
    host_milliseconds: np.ndarray | None = None  # the host's CPU time launching it, under the interpreter lock
    timeline: Timeline = field(default_factory=lambda: _shared_timeline or Timeline())
    _own: OwnSeconds = field(default_factory=OwnSeconds, repr=False)  # by launching thread (pass_clock)

    @property
    def busy_seconds(self) -> float:
        return self.timeline.busy_seconds

    @property
    def passes(self) -> int:
        return self.timeline.passes

    @classmethod
    def from_file(cls, path: Path | None = None) -> SimulatedDevice:
        """A table from PATH; a bare file name that is no file here names a bundled table
        (`device_costs/`); none: the bundled default."""
        bundled = resources.files(__package__).joinpath("device_costs", path.name if path else DEFAULT_COSTS)
        if path is not None and (path.exists() or path.parent != Path(".") or not bundled.is_file()):
            text = path.read_text()
        else:
            text = bundled.read_text()
        table = json.loads(text)
        name = path or DEFAULT_COSTS
        points = sorted((float(p["subwords"]), float(p["ms"]), p.get("host_ms")) for p in table["points"])
        if len(points) < 2:
            raise GraphError(f"{name}: a cost table needs two points or more")
        hosts = [host for _, _, host in points]
        if any(host is None for host in hosts) and any(host is not None for host in hosts):
            raise GraphError(f"{name}: host_ms is given for every point or for none")
        subwords, milliseconds = (np.array([point[i] for point in points]) for i in (0, 1))
        host = None if hosts[0] is None else np.array(hosts, dtype=float)
        return cls(table["card"], table["source"], subwords, milliseconds, host)

    def batch_seconds(self, subwords: int) -> float:
        """The device's share of a pass, interpolated between the measured points; past the last,
        at the last two's slope."""
        return _interpolated(self.subwords, self.milliseconds, subwords) / 1000

    def launch_seconds(self, subwords: int) -> float:
        """The host's CPU time launching a pass (0 where the table has no `host_ms`)."""
        if self.host_milliseconds is None:
            return 0.0
        return _interpolated(self.subwords, self.host_milliseconds, subwords) / 1000

    def run(self, subwords: int) -> None:
        """A pass of SUBWORDS positions, returning when it ends. Its launching first (the calling
        thread's CPU, under the interpreter lock), with the device taking up the work as it comes;
        a pass launched while another runs is queued behind it, as a GPU runs the work launched on
        it in order: it starts the moment the last one ends, without waiting for the thread that
        launched it, and ends no sooner than its launching does."""
        seconds = self.batch_seconds(subwords)
        launched_from = time.perf_counter()
        _hold_the_interpreter(self.launch_seconds(subwords))
        start, end = self.timeline.book(launched_from, seconds)
        self._own.add(end - start)
        time.sleep(max(0.0, end - time.perf_counter()))

    def pass_clock(self) -> Callable[[], float]:
        """The device's own time for what the calling thread launches from now: the returned stop,
        called in the same thread once its pass is done, gives the seconds the device spent on it
        (from when it took each pass up to its end; not the thread's wait for the interpreter
        after), as CUDA events around a pass give a card's (`runtime.pass_clock`)."""
        return self._own.clock()

    def report(self) -> dict[str, Any]:
        return {"card": self.card, "source": self.source, "busy_seconds": round(self.busy_seconds, 6), "passes": self.passes}


class Timeline:
    """When a simulated device is free next and how busy it has been, shared by whatever launches on it:
    the threads of one process, or the graph processes of one model (a spawned child takes it as an
    argument), each launching from an interpreter of its own onto one card, as processes do onto one
    GPU. Times are perf_counter's, the system's monotonic clock, the same in every process."""

    def __init__(self) -> None:
        # free at (perf_counter), busy seconds, passes: in shared memory, behind the array's lock
        self._values = multiprocessing.get_context("spawn").Array("d", 3)

    def book(self, launched_from: float, seconds: float) -> tuple[float, float]:
        """A pass launched from LAUNCHED_FROM taking the device SECONDS: it starts once the device is
        free and ends no sooner than now (its launching); (start, end)."""
        values = self._values
        with values.get_lock():
            start = max(launched_from, values[0])
            end = max(start + seconds, time.perf_counter())
            values[0] = end
            values[1] += seconds
            values[2] += 1
        return start, end

    @property
    def busy_seconds(self) -> float:
        return float(self._values[1])

    @property
    def passes(self) -> int:
        return int(self._values[2])


_shared_timeline: Timeline | None = None


def share_the_device(timeline: Timeline) -> None:
    """Book this process's simulated passes on TIMELINE (a graph process's, before its graphs make
    the device): the graph processes of one model then wait on one card."""
    global _shared_timeline
    _shared_timeline = timeline


def _interpolated(sizes: np.ndarray, values: np.ndarray, size: int) -> float:
    """VALUES at SIZE, between the points; past the last, at the last two's slope."""
    if size <= sizes[-1]:
        return float(np.interp(size, sizes, values))
    slope = (values[-1] - values[-2]) / (sizes[-1] - sizes[-2])
    return float(values[-1] + slope * (size - sizes[-1]))


def _hold_the_interpreter(seconds: float) -> None:
    """Spend SECONDS of this thread's CPU time in Python, as a launch does: the interpreter lock is
    held throughout but for its switch interval, so the time this takes grows with what else in
    the process wants the lock, and with what else wants the core."""
    if seconds <= 0:
        return
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        for _ in range(100):
            pass


_device: SimulatedDevice | None = None
_device_lock = threading.Lock()


def simulated_device(costs: Path | None = None) -> SimulatedDevice:
    """The process's simulated device (made on first use, from COSTS or the bundled table)."""
    global _device
    with _device_lock:
        if _device is None:
            _device = SimulatedDevice.from_file(costs)
        return _device


def made_simulated_device() -> SimulatedDevice | None:
    """The process's simulated device, if its graphs have made one."""
    return _device


@dataclass(frozen=True)
class DeviceZeros:
    """An output kept on the simulated device: zeros in name only, never made on the host."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]


class SimulatedGraph:
    """A graph of an export answered in zeros of its recorded output shapes, after the device's wait
    when it is the backbone graph."""

    def __init__(
        self, name: str, info: Mapping[str, Any], device: SimulatedDevice, derived_axes: Mapping[str, tuple[str, int]]
    ) -> None:
        self.name, self.device = name, device
        self.derived_axes = derived_axes  # the signature's: output axes sized from an input axis
        self.device_resident = True  # as a GPU's graphs: outputs kept on the device stay DeviceZeros
        self.execution_provider = "simulated"
        self.inputs = {i["name"]: tuple(i["axes"]) for i in info["inputs"]}
        self.outputs = {o["name"]: (tuple(o["axes"]), np.dtype(o["dtype"])) for o in info["outputs"]}
        self.input_names = tuple(self.inputs)
        self.output_names = tuple(self.outputs)

    def _axis_sizes(self, inputs: Mapping[str, Value]) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for name, axes in self.inputs.items():
            shape = np.shape(inputs[name])
            sizes.update({axis: int(shape[i]) for i, axis in enumerate(axes) if isinstance(axis, str)})
        derived = {
            axis: sizes.get(source, 0) + offset
            for axis, (source, offset) in self.derived_axes.items()
            if source in sizes or not source
        }
        return {**sizes, **derived}

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise GraphError(f"simulated graph {self.name}: missing inputs {missing}")
        sizes = self._axis_sizes(inputs)
        shapes = {}
        for name, (axes, _) in self.outputs.items():
            unknown = [axis for axis in axes if isinstance(axis, str) and axis not in sizes]
            if unknown:
                raise GraphError(f"simulated graph {self.name}: output {name}'s axes {unknown} follow from no input")
            shapes[name] = [sizes[a] if isinstance(a, str) else int(a) for a in axes]
        if BACKBONE_INPUT in inputs:
            self.device.run(int(np.prod(np.shape(inputs[BACKBONE_INPUT]))))
        return {
            name: DeviceZeros(tuple(shape), self.outputs[name][1])
            if name in keep_on_device
            else np.zeros(shape, self.outputs[name][1])
            for name, shape in shapes.items()
        }
