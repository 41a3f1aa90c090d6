"""Podman for the container tests: the stand-in base images, image builds from this machine's wheel
sources, and containers that are always removed.

No container registry is reachable where these tests run, so `FROM python:3.11-slim` and
Prometheus are STAND-INS made locally from Debian packages (standin_images.sh). The images under
test are built from the project's unmodified Dockerfiles.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.serving import poll_ready

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONTAINERS_CONF = HERE / "containers.conf"
TOOLS = ("podman", "mmdebstrap")
# CI sets it: the container tests then fail, not skip, on a machine without podman
REQUIRED = os.environ.get("NERSERVE_CONTAINER_TESTS") == "required"

# Where this machine's pip finds wheels (the CPU torch among them), handed to the build as the
# Dockerfiles' build arguments and mounted read-only at the same paths; only the folders that exist.
PIP_CONFIG_FOLDERS = ("/etc/xdg/pip", "/opt/wheels", "/opt/pypi", "/opt/pypi-more")


def environment() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def require_podman() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        message = f"{', '.join(missing)} not installed (apt-get install podman buildah runc mmdebstrap)"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], env=environment(), capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}… exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def make_standin_images() -> None:
    subprocess.run(["bash", str(HERE / "standin_images.sh")], env=environment(), check=True, timeout=900)


def build_args() -> list[str]:
    """The host's wheel sources as build arguments + mounts; TORCH_INDEX_URL empty: pip's own index
    (here the folder with the CPU wheel), as an air-gapped site builds."""
    args = ["--build-arg", "TORCH_INDEX_URL="]
    find_links = os.environ.get("PIP_FIND_LINKS") or _pip_config("global.find-links")
    extra_index = os.environ.get("PIP_EXTRA_INDEX_URL") or _pip_config("global.extra-index-url")
    if find_links:
        args += ["--build-arg", f"PIP_FIND_LINKS={find_links}"]
    if extra_index:
        args += ["--build-arg", f"PIP_EXTRA_INDEX_URL={extra_index}"]
    for folder in PIP_CONFIG_FOLDERS:
        if Path(folder).is_dir():
            args += ["-v", f"{folder}:{folder}:ro"]
    return args


def _pip_config(key: str) -> str:
    result = subprocess.run(["pip", "config", "get", key], capture_output=True, text=True, check=False)
    return " ".join(result.stdout.split()) if result.returncode == 0 else ""


def build(dockerfile: str, tag: str, models: str, *arguments: str, timeout: float = 1800) -> float:
    """Build an image from the repository (ARGUMENTS: more build arguments, NAME=VALUE); returns its size in MB."""
    more = [part for argument in arguments for part in ("--build-arg", argument)]
    podman(
        "build", "--pull=never", "--format", "docker", "-f", dockerfile, "-t", tag,
        "--build-arg", f"MODELS={models}", *more, *build_args(), str(ROOT),
        timeout=timeout,
    )  # fmt: skip
    return image_megabytes(tag)


def image_megabytes(tag: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip()) / 1e6


@contextmanager
def container(image: str, *args: str, name: str, command: Sequence[str] = ()) -> Iterator[str]:
    """A container of IMAGE run with podman's ARGS, COMMAND after the image (the args its ENTRYPOINT
    gets), removed on the way out."""
    podman("rm", "-f", name, check=False)
    podman("run", "-d", "--name", name, *args, image, *command)
    try:
        yield name
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def wait_ready(url: str, name: str, timeout: float = 180) -> None:
    def still_running() -> None:
        state = json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)
        if not state.get("Running"):
            raise AssertionError(f"container exited {state.get('ExitCode')}:\n{podman('logs', name).stderr[-3000:]}")

    if not poll_ready(url, still_running, timeout):
        raise AssertionError(f"{name} not ready in {timeout} s:\n{podman('logs', name).stderr[-3000:]}")
