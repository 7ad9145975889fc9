#!/usr/bin/env bash
# Prepare, here, what bench/gpu/run.sh needs on a GPU machine that reaches no package index:
# wheels (CPython 3.12, manylinux x86-64) of the project's dependencies that the GPU image lacks
# or holds at another version, at the versions of this checkout's .venv, into .whl/ (ignored by
# git; carried to the machine beside the checkout, about 20 MB). torch, numpy, safetensors,
# grpcio, protobuf, uvloop, pyyaml and pytest come from the image (see bench/gpu/README.md).
#
#   bench/gpu/prepare.sh            # then carry .whl/ and run: bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
PACKAGES=(pydantic pydantic-core annotated-types typing-inspection orjson aiohttp kopf python-json-logger
          iso8601 kubernetes durationpy websocket-client requests-oauthlib oauthlib pyasn1
          grpcio-health-checking xds-protos pytest-asyncio)
mkdir -p .whl
for name in "${PACKAGES[@]}"; do
  version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$name==$version"
done
du -sh .whl
