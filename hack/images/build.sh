#!/usr/bin/env bash
# Builds the operator, router, replica and envoy images from docker/ on this machine, with no container
# registry: starts a Docker engine of its own when none runs (and stops it), makes a Debian base
# image when python:3.11-slim cannot be pulled, and rebuilds only images whose inputs changed.
# The logic (and every option) is in cluster/modelplex_cluster/images.py; `--help` lists them.
#   hack/images/build.sh --json     # {"operator": "modelplex/operator:0.1.0-<hash>", ...}
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The project's venv (`make venv`): the tooling imports modelplex, which needs its dependencies.
python="$root/.venv/bin/python"
[[ -x "$python" ]] || python=python3
PYTHONPATH="$root/cluster${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m modelplex_cluster.images "$@"
