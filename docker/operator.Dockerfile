# syntax=docker/dockerfile:1
# The Modelplex operator: `modelplex operator` (kopf). Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t modelplex/operator:0.1.0 .
# Pin the base by digest in CI (python:3.11-slim@sha256:...) for reproducible images.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY modelplex ./modelplex
COPY replica ./replica
COPY router ./router
COPY operator ./operator
# The project and every dependency as wheels: the final stage installs without a network.
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 10001 modelplex \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin modelplex
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels modelplex
USER 10001:10001
# kopf's liveness endpoint (MODELPLEX_OPERATOR_HEALTH; the chart's health.port).
EXPOSE 8080
CMD ["modelplex", "operator"]
