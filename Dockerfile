# nerserve on a GPU node: ONNX Runtime's CUDA execution provider over graphs exported at build time.
# CUDA and cuDNN come from the base image only: the serving image has no torch (the core install),
# and the export stage that needs torch uses its CPU wheel and is left behind.
# Build: docker build -t nerserve:0.1.0-cuda .      Run: see docker-compose.yml or deploy/.
FROM python:3.11-slim AS graphs
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NERSERVE_GRAPH_CACHE=/graphs
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints constraints
COPY nerserve nerserve
COPY ner ner
COPY service service
COPY export export
COPY loadtest loadtest
COPY model_store model_store
# hadolint ignore=DL3013
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" \
    && pip install -c constraints/lock.txt ".[cpu,export]" \
    && for model in model_store/*/; do nerserve export "$(basename "$model")" || exit 1; done

FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
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
COPY constraints constraints
COPY nerserve nerserve
COPY ner ner
COPY service service
COPY export export
COPY loadtest loadtest
# the core with the GPU runtime: exported graphs + numpy decoding, no torch
RUN pip install -c constraints/lock.txt ".[gpu]"
COPY --chown=nerserve:nerserve model_store model_store
COPY --from=graphs --chown=nerserve:nerserve /graphs /cache/graphs

# Models in a volume, exported graphs cached in another: a restart does not re-export.
ENV NERSERVE_HOST=0.0.0.0 \
    NERSERVE_PORT=8000 \
    NERSERVE_DEVICE=cuda \
    NERSERVE_MODEL_STORE=/app/model_store \
    NERSERVE_GRAPH_CACHE=/cache/graphs \
    NERSERVE_DATA=/data \
    HF_HUB_OFFLINE=1
RUN mkdir -p /data && chown -R nerserve:nerserve /cache /data
VOLUME ["/app/model_store", "/cache/graphs"]
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["curl", "-fsS", "http://127.0.0.1:8000/health/live"]
ENTRYPOINT ["nerserve", "serve"]
