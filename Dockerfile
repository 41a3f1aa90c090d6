# nerserve on a GPU node: ONNX Runtime (CUDA execution provider) over the exported graphs.
# Build: docker build -t nerserve .   Run: see docker-compose.yml (GPU reservation, volumes).
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ARG TORCH_VERSION=2.13.0
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv \
    && useradd --create-home --uid 10001 nerserve

WORKDIR /app
COPY pyproject.toml README.md ./
COPY nerserve nerserve
COPY ner ner
COPY service service
COPY export export
# torch first and pinned (export and the TorchScript runtime), then the package with the GPU extra
# (its own dependency ranges, as pyproject.toml pins them).
# hadolint ignore=DL3013
RUN pip install "torch==${TORCH_VERSION}" && pip install ".[gpu]"
COPY --chown=nerserve:nerserve model_store model_store

# Models in a volume, exported graphs cached in another: a restart does not re-export.
ENV NERSERVE_HOST=0.0.0.0 \
    NERSERVE_PORT=8000 \
    NERSERVE_DEVICE=cuda \
    NERSERVE_MODEL_STORE=/app/model_store \
    NERSERVE_BUILD_DIR=/cache/graphs \
    NERSERVE_DATA=/data \
    HF_HUB_OFFLINE=1
RUN mkdir -p /cache/graphs /data && chown -R nerserve:nerserve /cache /data
VOLUME ["/app/model_store", "/cache/graphs"]
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s --retries=3 \
    CMD ["curl", "-fsS", "http://127.0.0.1:8000/health/live"]
ENTRYPOINT ["nerserve", "serve"]
