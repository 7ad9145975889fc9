# The Modelplex replica runtime: `modelplex replica` with torch (the `replica` extra).
# hack/images/build.sh builds it, also where no registry can be reached; by hand, from the
# repository root:
#   docker build -f docker/replica.Dockerfile -t modelplex/replica:0.1.0 .
# It serves the built-in TorchScript handler as it is. For your own handler, build on it:
#   FROM modelplex/replica:0.1.0
#   COPY recs/ /app/recs/          # then `handler: "recs.models:Recommender"` in the spec
# BASE_IMAGE: any image with Python 3.11 and its venv module (pin it by digest for reproducible
# images). pip trusts the certificates in docker/ca/ too (a network that intercepts TLS); the final
# stage copies only what was installed, so they never reach the image.
# TORCH_VARIANT: `cuda` (default: PyPI's torch, for GPU pods) or `cpu`: with
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu a CPU-only torch (far smaller); with PyPI
# alone, PyPI's torch less the packages that only a GPU loads (docker/install_deps.py).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG TORCH_VARIANT=cuda
ARG TORCH_INDEX_URL=""
WORKDIR /src
COPY docker/install_deps.py docker/requirements/replica.lock ./
COPY docker/ca/ ./ca/
RUN python3 install_deps.py --venv /opt/modelplex --requirements replica.lock
COPY pyproject.toml README.md ./
COPY modelplex ./modelplex
COPY replica ./replica
COPY router ./router
COPY operator ./operator
COPY launcher ./launcher
RUN python3 install_deps.py --venv /opt/modelplex --project . --target /opt/app

FROM ${BASE_IMAGE}
ENV PATH=/opt/app/bin:/opt/modelplex/bin:$PATH PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN groupadd --gid 10001 modelplex \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin modelplex
# Dependencies, then the project: a source change leaves the (large) first layer as it is.
COPY --from=build /opt/modelplex /opt/modelplex
COPY --from=build /opt/app /opt/app
# The project is found without PYTHONPATH, which a pod may set for its own code.
RUN /opt/modelplex/bin/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'modelplex-app.pth').write_text('/opt/app\\n')"
# Handler code goes here (it is on PYTHONPATH).
WORKDIR /app
USER 10001:10001
EXPOSE 9000
CMD ["modelplex", "replica"]
