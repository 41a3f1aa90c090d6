"""The images, built and run for real with podman (.ci/run runs the `container` tests; the
`gpu_image` test downloads gigabytes and runs on demand: `pytest -m gpu_image tests/containers`).

The base images are STAND-INS (tests/containers/standin_images.sh): `python:3.11-slim` is Debian's
python3 in a Debian minbase, Prometheus is Debian's package, because no registry is reachable here.
The Dockerfiles themselves are the project's, unmodified.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from nerserve.ner.runtime.openvino import cpu_precision_refusal
from tests.containers import podman as pm
from tests.serving import Server, assert_same_results, free_port

pytestmark = pytest.mark.container

CPU_TAG = "nerserve-test/nerserve:cpu"
GPU_TAG = "nerserve-test/nerserve:cuda"
MODEL = "span-conll03"
README_TEXTS = [
    "EU rejects German call to boycott British lamb.",
    "Angela Merkel met Boris Johnson in London on Tuesday.",
    "Peter Blackburn of the European Commission spoke in Brussels.",
]
REPORT = pm.ROOT / "build" / "containers.json"


def _report(**figures: object) -> None:
    """Image sizes and build times, kept for the README's table (build/ is not committed)."""
    REPORT.parent.mkdir(exist_ok=True)
    report = json.loads(REPORT.read_text()) if REPORT.is_file() else {}
    report.update(figures)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(figures)


@pytest.fixture(scope="module")
def cpu_image() -> str:
    pm.require_podman()
    pm.make_standin_images()
    started = time.monotonic()
    size = pm.build("Dockerfile.cpu", CPU_TAG, MODEL, "INT8=true", "EXTRAS=cpu,openvino")
    seconds = round(time.monotonic() - started)
    _report(cpu_image_mb=round(size), cpu_image_models=f"{MODEL}, fp32 and INT8, with OpenVINO", cpu_build_seconds=seconds)
    return CPU_TAG


@pytest.fixture()
def running(cpu_image: str) -> Iterator[tuple[str, str]]:
    port = free_port()
    with pm.container(cpu_image, "-p", f"127.0.0.1:{port}:8000", name="nerserve-test-cpu") as name:
        url = f"http://127.0.0.1:{port}"
        pm.wait_ready(url, name)
        yield url, name


def _extract(url: str, texts: list[str], timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{url}/extract", json={"model": MODEL, "texts": texts}, timeout=timeout)


def test_cpu_image_answers_as_make_serve_does(running: tuple[str, str]) -> None:
    url, _ = running
    in_image = _extract(url, README_TEXTS)
    assert in_image.status_code == 200, in_image.text
    host = Server(models=MODEL)
    try:
        host.wait_ready()
        on_host = _extract(host.url, README_TEXTS)
    finally:
        host.stop()
    assert on_host.status_code == 200
    assert in_image.json()["version"] == on_host.json()["version"]
    assert_same_results(in_image.json()["results"], on_host.json()["results"])
    types = {(e["text"], e["type"]) for e in in_image.json()["results"][0]["entities"]}
    assert {("EU", "ORG"), ("German", "MISC"), ("British", "MISC")} <= types


def test_cpu_image_serves_its_int8_graphs_when_asked(cpu_image: str) -> None:
    """Built with INT8=true, the slim image holds the INT8 graphs too (it has no torch to export
    them): NERSERVE_INT8=true serves them."""
    port = free_port()
    environment = ["-e", "NERSERVE_INT8=true", "-p", f"127.0.0.1:{port}:8000"]
    with pm.container(cpu_image, *environment, name="nerserve-test-cpu-int8") as name:
        url = f"http://127.0.0.1:{port}"
        pm.wait_ready(url, name)
        assert httpx.get(f"{url}/info").json()["precision"] == "int8"
        response = _extract(url, README_TEXTS)
    assert response.status_code == 200, response.text
    types = {(e["text"], e["type"]) for e in response.json()["results"][0]["entities"]}
    assert {("EU", "ORG"), ("German", "MISC"), ("British", "MISC")} <= types


def test_cpu_image_built_with_openvino_serves_through_it_when_asked(cpu_image: str) -> None:
    """Built with EXTRAS=cpu,openvino, NERSERVE_RUNTIME=openvino serves the image's ONNX graphs
    through OpenVINO, in bf16 where this CPU has it (the container sees the host's CPU)."""
    precision = "bf16" if cpu_precision_refusal("bf16") is None else "fp32"
    port = free_port()
    environment = ["-e", "NERSERVE_RUNTIME=openvino", "-e", f"NERSERVE_PRECISION={precision}", "-p", f"127.0.0.1:{port}:8000"]
    with pm.container(cpu_image, *environment, name="nerserve-test-cpu-openvino") as name:
        url = f"http://127.0.0.1:{port}"
        pm.wait_ready(url, name)
        (model,) = httpx.get(f"{url}/models").json()["models"]
        response = _extract(url, README_TEXTS)
    assert set(model["execution_providers"].values()) == {f"OpenVINO CPU ({precision})"}
    assert response.status_code == 200, response.text
    types = {(e["text"], e["type"]) for e in response.json()["results"][0]["entities"]}
    assert {("EU", "ORG"), ("German", "MISC"), ("British", "MISC")} <= types


def test_cpu_image_on_one_cpu_of_a_cpuset_runs_its_graphs_on_that_cpu(cpu_image: str) -> None:
    """A container given one CPU (a cgroup cpuset, as a Kubernetes pod of one whole CPU gets from the
    static CPU manager): the graphs' intra-op threads are sized to it. Left to its own default, ONNX
    Runtime sizes its pool by the machine's cores and pins each thread to one of them, which the
    cpuset refuses: it logs an error a thread and runs them all on the one CPU."""
    port = free_port()
    with pm.container(cpu_image, "--cpuset-cpus", "0", "-p", f"127.0.0.1:{port}:8000", name="nerserve-test-cpu-1") as name:
        url = f"http://127.0.0.1:{port}"
        pm.wait_ready(url, name)
        batching = httpx.get(f"{url}/info").json()["batching"]
        response = _extract(url, README_TEXTS)
        logs = pm.podman("logs", name).stderr
    assert (batching["graph_lanes"], batching["graph_threads"]) == (1, 1)
    assert response.status_code == 200, response.text
    assert "setaffinity" not in logs, logs[-2000:]


def test_cpu_image_runs_as_the_helm_chart_runs_it(cpu_image: str) -> None:
    """The chart's container spec (tests/test_deploy.py renders it), applied to the image by podman:
    its args after the image's ENTRYPOINT, its environment, its user, its read-only root with its
    emptyDir volumes writable and empty; HTTP workers asked for, whose engine socket goes to /tmp
    (docs/decisions/deployment.md)."""
    from tests.test_deploy import rendered

    repository, tag = cpu_image.rsplit(":", 1)
    values = {"image": {"repository": repository, "tag": tag}, "httpWorkers": 2}
    (deployment,) = [d for d in rendered(values) if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]  # type: ignore[index]
    container = spec["containers"][0]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    port = free_port()
    run = ["-p", f"127.0.0.1:{port}:{container['ports'][0]['containerPort']}"]
    run += ["--user", str(spec["securityContext"]["runAsUser"])]
    run += [f"--env={e['name']}={e['value']}" for e in container["env"] if "value" in e]
    if container["securityContext"]["readOnlyRootFilesystem"]:
        run += ["--read-only", "--read-only-tmpfs=false"]
    # an emptyDir starts empty: podman's tmpfs would copy the image's files there
    run += [f"--tmpfs={m['mountPath']}:notmpcopyup" for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]]
    assert "command" not in container  # the image's ENTRYPOINT, then the chart's args
    with pm.container(cpu_image, *run, name="nerserve-test-helm", command=container.get("args", [])) as name:
        url = f"http://127.0.0.1:{port}"
        pm.wait_ready(url, name)
        assert httpx.get(f"{url}{container['readinessProbe']['httpGet']['path']}").status_code == 200
        assert httpx.get(f"{url}/info").json()["http_workers"] == 2
        assert _extract(url, README_TEXTS).status_code == 200
        # the kubelet runs the preStop hook in the container: the image has what it names
        pm.podman("exec", name, *container["lifecycle"]["preStop"]["exec"]["command"], timeout=60)


def test_a_read_only_root_without_a_writable_tmp_stops_a_server_with_workers_saying_so(cpu_image: str) -> None:
    read_only = ["--read-only", "--read-only-tmpfs=false", "-e", "NERSERVE_HTTP_WORKERS=2"]
    with pm.container(cpu_image, *read_only, name="nerserve-test-ro-no-tmp") as name:
        exit_code = pm.podman("wait", name, timeout=120).stdout.strip()
        logs = pm.podman("logs", name).stderr
    assert exit_code != "0"
    assert "mount a writable folder at /tmp" in logs and "Traceback" not in logs, logs[-2000:]


def test_cpu_image_healthcheck_passes(running: tuple[str, str]) -> None:
    """The image's own HEALTHCHECK, run as the engine counts it: healthy at the first of its
    `retries` runs that passes (a run's exec alone can take seconds on a busy machine)."""
    _, name = running
    retries = json.loads(pm.podman("inspect", "--format", "{{json .Config.Healthcheck}}", name).stdout)["Retries"]
    runs = []
    for _ in range(retries):
        runs.append(pm.podman("healthcheck", "run", name, check=False))
        if runs[-1].returncode == 0:
            break
    assert runs[-1].returncode == 0, [run.stderr for run in runs]
    health = json.loads(pm.podman("inspect", "--format", "{{json .State.Health}}", name).stdout)
    assert health["Status"] == "healthy"


def test_sigterm_answers_the_request_in_flight_then_exits_0(running: tuple[str, str]) -> None:
    url, name = running
    # a request of a few seconds on the CPU (900 sentences, within the 1,024 a request may queue),
    # in flight when the signal comes
    texts = [" ".join(README_TEXTS * 6)] * 50
    answered: dict[str, httpx.Response] = {}
    sender = threading.Thread(target=lambda: answered.setdefault("response", _extract(url, texts, timeout=60)))
    sender.start()
    _wait_in_flight(url, answered)
    signalled = time.monotonic()
    pm.podman("kill", "--signal", "TERM", name)
    exit_code = pm.podman("wait", name, timeout=60).stdout.strip()
    took = time.monotonic() - signalled
    sender.join(60)
    assert exit_code == "0"
    assert took < 30  # the image's drain period (NERSERVE_DRAIN_SECONDS)
    assert answered["response"].status_code == 200
    assert len(answered["response"].json()["results"]) == len(texts)


def _wait_in_flight(url: str, answered: dict[str, httpx.Response]) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        if re.search(r"^nerserve_in_flight\{[^}]*\} [1-9]", metrics, re.M):
            return
        assert "response" not in answered, answered["response"].text
        time.sleep(0.02)
    raise AssertionError("the long request never showed in /metrics")


def test_compose_stack_up_and_scraped(cpu_image: str, tmp_path: Path) -> None:
    """docker-compose.yml + docker-compose.cpu.yml, as a user without a GPU brings it up; the test's
    own override only swaps in the stand-in Prometheus, leaves Grafana out and picks free ports."""
    nerserve_port, prometheus_port = free_port(), free_port()
    override = tmp_path / "compose.test.yml"
    override.write_text(
        "services:\n"
        "  nerserve:\n"
        f"    ports: !override ['127.0.0.1:{nerserve_port}:8000']\n"
        "  prometheus:\n"
        "    image: nerserve-test/prometheus:bookworm\n"
        f"    ports: !override ['127.0.0.1:{prometheus_port}:9090']\n"
        "  grafana:\n"
        "    profiles: [dashboards]\n"
    )
    pm.podman("tag", cpu_image, "localhost/nerserve:cpu")
    files = ["-f", "docker-compose.yml", "-f", "docker-compose.cpu.yml", "-f", str(override)]
    compose = [str(Path(sys.executable).parent / "podman-compose"), "-p", "nerserve-test", *files]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*compose, *args], cwd=pm.ROOT, env=pm.environment(), capture_output=True, text=True, timeout=300)

    up = run("up", "-d", "--no-build")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        url = f"http://127.0.0.1:{nerserve_port}"
        pm.wait_ready(url, "nerserve-test_nerserve_1")
        assert _extract(url, README_TEXTS[:1]).status_code == 200
        up_value, counter = _scraped(f"http://127.0.0.1:{prometheus_port}")
        assert up_value == "1"
        assert counter, "Prometheus has no nerserve_requests_total"
    finally:
        run("down", "-v", "-t", "5")


def _scraped(prometheus: str, timeout: float = 90) -> tuple[str, list[object]]:
    """Prometheus's `up` for the nerserve job and the scraped request counters, once both are in."""
    end = time.monotonic() + timeout
    up_value, counter = "", []
    while time.monotonic() < end:
        try:
            up = httpx.get(f"{prometheus}/api/v1/query", params={"query": 'up{job="nerserve"}'}, timeout=5).json()
            found = httpx.get(f"{prometheus}/api/v1/query", params={"query": "nerserve_requests_total"}, timeout=5)
            up_value = up["data"]["result"][0]["value"][1] if up["data"]["result"] else ""
            counter = found.json()["data"]["result"]
            if up_value == "1" and counter:
                break
        except (httpx.TransportError, ValueError, KeyError):
            pass
        time.sleep(1)
    return up_value, counter


# The check runs inside the image: everything the CUDA provider and the CUDA / cuDNN libraries link is
# found except the driver (libcuda.so.1, which the NVIDIA container runtime mounts from the host), the
# CUDA major the provider was built for is that of the CUDA wheels beside it, and a session asked for
# the CUDA provider fails for want of that driver alone (no library of the image is missing).
GPU_IMAGE_CHECK = r"""
import glob, importlib.metadata as md, json, pathlib, re, subprocess, sys
import onnxruntime
capi = pathlib.Path(onnxruntime.__file__).parent / "capi"
wheels = glob.glob(sys.prefix + "/lib/python3*/site-packages/nvidia/*/lib/lib*.so*")
libraries = [str(capi / "libonnxruntime_providers_cuda.so"), *wheels]
missing, needed = set(), {}
for library in libraries:
    ldd = subprocess.run(["ldd", library], capture_output=True, text=True).stdout
    missing |= set(re.findall(r"^\s*(\S+) => not found", ldd, re.M))
    if library.endswith("providers_cuda.so"):
        needed = dict(re.findall(r"^\s*(lib(?:cudart|cublas|cufft|curand))\.so\.(\d+)", ldd, re.M))
try:
    session = onnxruntime.InferenceSession("/tiny.onnx", providers=["CUDAExecutionProvider"])
    session_providers = session.get_providers()
except Exception as error:
    session_providers = [repr(error)]
print(json.dumps({"ort": onnxruntime.__version__, "missing": sorted(missing), "needed": needed,
                  "cuda_runtime": md.version("nvidia-cuda-runtime"), "cudnn": md.version("nvidia-cudnn-cu13"),
                  "libraries": len(libraries), "session_providers": session_providers}))
"""


def _tiny_graph(folder: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info
    relu = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([relu], "tiny", [value("x", TensorProto.FLOAT, [2])], [value("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by any onnxruntime the image may pin
    onnx.save(model, folder / "tiny.onnx")
    return folder / "tiny.onnx"


@pytest.fixture(scope="module")
def gpu_image() -> str:
    pm.require_podman()
    pm.make_standin_images()
    started = time.monotonic()
    size = pm.build("Dockerfile", GPU_TAG, MODEL, timeout=3600)
    _report(gpu_image_mb=round(size), gpu_build_seconds=round(time.monotonic() - started))
    return GPU_TAG


@pytest.mark.gpu_image
def test_gpu_image_builds_and_its_cuda_provider_links(gpu_image: str, tmp_path: Path) -> None:
    tiny = _tiny_graph(tmp_path)
    mount = f"{tiny}:/tiny.onnx:ro"
    checked = pm.podman("run", "--rm", "-v", mount, "--entrypoint", "python", gpu_image, "-c", GPU_IMAGE_CHECK)
    found = json.loads(checked.stdout.strip().splitlines()[-1])
    print(found)
    lock = (pm.ROOT / "constraints" / "lock.txt").read_text()
    assert found["ort"] == _pinned(lock, "onnxruntime-gpu")
    assert found["missing"] == ["libcuda.so.1"], f"libraries the image lacks: {found['missing']}"
    cuda_major = found["needed"]["libcudart"]
    assert found["needed"]["libcublas"] == cuda_major
    assert found["cuda_runtime"].split(".")[0] == cuda_major == _pinned(lock, "nvidia-cuda-runtime").split(".")[0]
    # no GPU here: the provider cannot load for want of the driver, and ONNX Runtime says so (and
    # falls back to the CPU, which nerserve itself refuses: --device cuda is checked at start-up)
    assert checked.stderr.count("cannot open shared object file") == 1
    assert "libcuda.so.1: cannot open shared object file" in checked.stderr


# Alone, this sentence's seeds all miss span-conll03's filter: no candidate leaves the span proposal.
# onnxruntime before 1.32 failed such a batch on a reduction over the empty candidates.
NO_CANDIDATE = "All four teams are level with one point each from one game ."


@pytest.mark.gpu_image
def test_gpu_image_serves_its_graphs_on_its_own_onnx_runtime(gpu_image: str) -> None:
    """The image's onnxruntime-gpu on its CPU provider (no GPU here): the graphs exported at build
    time answer lone sentences, one without any candidate span among them."""
    port = free_port()
    with pm.container(gpu_image, "-e", "NERSERVE_DEVICE=cpu", "-p", f"127.0.0.1:{port}:8000", name="nerserve-test-gpu") as name:
        url = f"http://127.0.0.1:{port}"
        pm.wait_ready(url, name)
        for text in [NO_CANDIDATE, *README_TEXTS]:
            answer = _extract(url, [text])
            assert answer.status_code == 200, answer.text
        assert _extract(url, [NO_CANDIDATE]).json()["results"][0]["entities"] == []
        types = {(e["text"], e["type"]) for e in _extract(url, README_TEXTS[:1]).json()["results"][0]["entities"]}
        assert {("EU", "ORG"), ("German", "MISC"), ("British", "MISC")} <= types


def _pinned(lock: str, name: str) -> str:
    found = re.search(rf"^{re.escape(name)}==(\S+)", lock, re.M)
    assert found, f"{name} is not pinned in constraints/lock.txt"
    return found[1]
