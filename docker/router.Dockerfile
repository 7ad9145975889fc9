# syntax=docker/dockerfile:1
# The Modelplex router: `modelplex router` (the operator's MODELPLEX_ROUTER_IMAGE, the chart's
# routerImage). Build from the repository root:
#   docker build -f docker/router.Dockerfile -t modelplex/router:0.1.0 .
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
# No torch: the router never imports the replica.
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 10001 modelplex \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin modelplex
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels modelplex
# The operator runs router pods as this user (runAsNonRoot, runAsUser 10001).
USER 10001:10001
EXPOSE 8000
CMD ["modelplex", "router"]
