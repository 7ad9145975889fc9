# syntax=docker/dockerfile:1
# The Modelplex replica runtime: `modelplex replica` with torch (the `replica` extra).
# Build from the repository root:
#   docker build -f docker/replica.Dockerfile -t modelplex/replica:0.1.0 .
# It serves the built-in TorchScript handler as it is. For your own handler, build on it:
#   FROM modelplex/replica:0.1.0
#   COPY recs/ /app/recs/          # then `handler: "recs.models:Recommender"` in the spec
# CPU-only torch (much smaller): --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# Pin the base by digest in CI (python:3.11-slim@sha256:...) for reproducible images.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY modelplex ./modelplex
COPY replica ./replica
COPY router ./router
COPY operator ./operator
RUN pip wheel ${PIP_EXTRA_INDEX_URL:+--extra-index-url "$PIP_EXTRA_INDEX_URL"} --wheel-dir /wheels ".[replica]"

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app
RUN groupadd --gid 10001 modelplex \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin modelplex
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "modelplex[replica]"
# Handler code goes here (it is on PYTHONPATH).
WORKDIR /app
USER 10001:10001
EXPOSE 9000
CMD ["modelplex", "replica"]
