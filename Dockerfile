# nerserve on a GPU node: ONNX Runtime's CUDA execution provider over graphs exported at build time.
# The serving stage has no torch: onnxruntime-gpu with the CUDA and cuDNN libraries of its own major
# from their pip wheels (constraints/lock.txt pins them together), registered with the dynamic loader;
# the driver (libcuda.so.1) is mounted by the NVIDIA container runtime at run time. The export stage
# uses torch's CPU wheel and is left behind.
# Build: docker build -t nerserve:0.1.0-cuda .      Run: see docker-compose.yml or deploy/.
# Build arguments as in Dockerfile.cpu (README "Images"): MODELS, TORCH_INDEX_URL, PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS.
FROM python:3.11-slim AS graphs
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG MODELS=
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NERSERVE_GRAPH_CACHE=/graphs
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints constraints
COPY nerserve nerserve
COPY model_store model_store
COPY docker/select_models.sh /usr/local/bin/select-models
# The graphs are exported, and their parity checked, by the ONNX Runtime release that serves them
# (onnxruntime-gpu's pin; its CPU provider runs the same kernels): releases differ, and one that
# fails a graph should fail the build, not a request.
# hadolint ignore=DL3013
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}" \
    && pip install -c constraints/lock.txt ".[cpu,export]" \
    && pip install --no-deps "onnxruntime==$(sed -n 's/^onnxruntime-gpu==//p' constraints/lock.txt)" \
    && select-models "$MODELS" model_store /selected/model_store \
    && for model in /selected/model_store/*/; do \
        NERSERVE_MODEL_STORE=/selected/model_store nerserve export "$(basename "$model")" || exit 1; done

FROM python:3.11-slim
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG MODELS=
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 nerserve
WORKDIR /app
COPY pyproject.toml README.md ./
COPY constraints constraints
COPY nerserve nerserve
# the core with the GPU runtime: exported graphs + numpy decoding, no torch; the nvidia wheels' library
# folders go to ld.so.conf so that the CUDA provider (and ldd on it) finds them without LD_LIBRARY_PATH
RUN pip install -c constraints/lock.txt ".[gpu]" \
    && python -c "import nvidia, pathlib; print('\n'.join(sorted({str(p.parent) for d in nvidia.__path__ for p in pathlib.Path(d).rglob('lib*.so*')})))" \
        > /etc/ld.so.conf.d/nvidia-wheels.conf \
    && ldconfig
COPY --from=graphs --chown=nerserve:nerserve /selected/model_store model_store
COPY --from=graphs --chown=nerserve:nerserve /graphs /cache/graphs

# The models and their graphs, exported above, as volumes: an empty named volume starts with the
# image's files; one of other models' folders, or of their graphs exported elsewhere (this image
# has no torch to export them), replaces them (docs/decisions/deployment.md).
ENV NERSERVE_HOST=0.0.0.0 \
    NERSERVE_PORT=8000 \
    NERSERVE_DEVICE=cuda \
    NERSERVE_MODELS=${MODELS} \
    NERSERVE_MODEL_STORE=/app/model_store \
    NERSERVE_GRAPH_CACHE=/cache/graphs \
    NERSERVE_DATA_ROOT=/data \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HF_HUB_OFFLINE=1
RUN mkdir -p /data && chown -R nerserve:nerserve /cache /data
VOLUME ["/app/model_store", "/cache/graphs"]
USER 10001
EXPOSE 8000
# timeout 10 s: the check is an exec into the container, which alone can take seconds on a busy
# node; a too-tight timeout marks a serving container unhealthy
HEALTHCHECK --interval=10s --timeout=10s --start-period=120s --retries=3 \
    CMD ["curl", "-fsS", "http://127.0.0.1:8000/health/live"]
ENTRYPOINT ["nerserve", "serve"]
