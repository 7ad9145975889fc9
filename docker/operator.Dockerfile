# The Modelplex operator: `modelplex operator` (kopf). hack/images/build.sh builds it, also where
# no registry can be reached; by hand, from the repository root:
#   docker build -f docker/operator.Dockerfile -t modelplex/operator:0.1.0 .
# BASE_IMAGE: any image with Python 3.11 and its venv module (pin it by digest for reproducible
# images). pip trusts the certificates in docker/ca/ too (a network that intercepts TLS); the final
# stage copies only what was installed, so they never reach the image.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY docker/install_deps.py docker/requirements/base.lock ./
COPY docker/ca/ ./ca/
RUN python3 install_deps.py --venv /opt/modelplex --requirements base.lock
COPY pyproject.toml README.md ./
COPY modelplex ./modelplex
COPY replica ./replica
COPY router ./router
COPY operator ./operator
COPY launcher ./launcher
RUN python3 install_deps.py --venv /opt/modelplex --project . --target /opt/app

FROM ${BASE_IMAGE}
ENV PATH=/opt/app/bin:/opt/modelplex/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN groupadd --gid 10001 modelplex \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin modelplex
# Dependencies, then the project: a source change leaves the (large) first layer as it is.
COPY --from=build /opt/modelplex /opt/modelplex
COPY --from=build /opt/app /opt/app
# The project is found without PYTHONPATH, which a pod may set for its own code.
RUN /opt/modelplex/bin/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'modelplex-app.pth').write_text('/opt/app\\n')"
USER 10001:10001
# kopf's liveness endpoint (MODELPLEX_OPERATOR_HEALTH; the chart's health.port).
EXPOSE 8080
CMD ["modelplex", "operator"]
