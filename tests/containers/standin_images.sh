#!/usr/bin/env bash
# Test harness only: makes the local images the container tests build FROM, on a machine where no
# container registry is reachable. Nothing here goes into the project's images as such:
#   nerserve-test/base:bookworm  Debian minbase from this machine's apt sources (mmdebstrap), with
#                                this machine's extra CA certificates (its HTTPS proxy re-signs TLS)
#   python:3.11-slim             a STAND-IN for the official image: that base + Debian's python3
#                                (3.11 on bookworm) with a venv at /usr/local, so an unmodified
#                                `FROM python:3.11-slim` builds
#   nerserve-test/prometheus     a stand-in for prom/prometheus: Debian's prometheus package
# Each image is made once and kept; CONTAINERS_CONF must point at tests/containers/containers.conf.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

have() { podman image exists "$1"; }

if ! have nerserve-test/base:bookworm; then
    mkdir -p "$work/certs"
    cp /usr/local/share/ca-certificates/*.crt "$work/certs/" 2>/dev/null || true
    # the host's apt sources (a mirror, where the host has one); the certificates go in before
    # ca-certificates' own hook builds the bundle
    mmdebstrap --quiet --variant=minbase --include=ca-certificates \
        --setup-hook='mkdir -p "$1/usr/local/share/ca-certificates"' \
        --setup-hook="cp $work/certs/*.crt \"\$1/usr/local/share/ca-certificates/\" || true" \
        --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
        --customize-hook='rm -rf "$1/var/lib/apt/lists/"*' \
        bookworm "$work/rootfs.tar" /etc/apt/sources.list.d/debian.sources
    podman import --quiet \
        --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'CMD ["/bin/bash"]' \
        "$work/rootfs.tar" nerserve-test/base:bookworm >/dev/null
fi

if ! have docker.io/library/python:3.11-slim; then
    cat >"$work/Containerfile.python" <<'CONTAINERFILE'
FROM nerserve-test/base:bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv --upgrade-deps /usr/local \
    && ln -sf /usr/local/bin/python3 /usr/local/bin/python
ENV LANG=C.UTF-8
CMD ["python3"]
CONTAINERFILE
    podman build --quiet --pull=never --format docker -t docker.io/library/python:3.11-slim \
        -f "$work/Containerfile.python" "$work" >/dev/null
fi

if ! have nerserve-test/prometheus:bookworm; then
    cat >"$work/Containerfile.prometheus" <<'CONTAINERFILE'
FROM nerserve-test/base:bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
CONTAINERFILE
    podman build --quiet --pull=never --format docker -t nerserve-test/prometheus:bookworm \
        -f "$work/Containerfile.prometheus" "$work" >/dev/null
fi
