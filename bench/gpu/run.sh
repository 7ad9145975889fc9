#!/usr/bin/env bash
# The one GPU script (issue "the cost of a swap"): from a clean checkout, at most 7 minutes, every
# number into one results file. On a machine without a GPU it runs to the end with the GPU parts
# skipped and says so. See bench/gpu/README.md.
#
#   bench/gpu/run.sh [RESULTS_FILE]     # default bench/results/gpu-<date>/results.md
#
# Python: $PYTHON, else this checkout's .venv, else python3 with the wheels of .whl/
# (bench/gpu/prepare.sh) installed into a folder of its own: a GPU machine reaches no index.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
RESULTS=${1:-bench/results/gpu-$(date -u +%Y-%m-%d)/results.md}
mkdir -p "$(dirname "$RESULTS")"
started=$(date +%s)

if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]] && .venv/bin/python -c "import pydantic, torch" 2>/dev/null; then PY=.venv/bin/python
else
  PY=python3
  if [[ -d .whl ]]; then
    site=${TMPDIR:-/tmp}/modelplex-gpu-site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
      || echo "warning: installing .whl/ failed" >&2
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
# This checkout's packages first (pyproject's package roots), ahead of any installed copy.
export PYTHONPATH="$ROOT:$ROOT/replica:$ROOT/router:$ROOT/operator:$ROOT/cluster:$ROOT/launcher${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

gpu=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>/dev/null)
{
  echo "# bench/gpu/run.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "- machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -1)"
  if [[ -n "$gpu" ]]; then
    echo "- GPU: $gpu"
  else
    echo "- GPU: **none** (torch sees no CUDA device): the GPU parts below are skipped, said so in each"
  fi
  echo
} > "$RESULTS"

# part NAME TIMEOUT_S COMMAND...: its output into the results file, bounded in time; a failure
# is written down and the script goes on to the next part.
part() {
  local name=$1 limit=$2; shift 2
  echo "==> $name (at most ${limit} s)" >&2
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >> "$RESULTS" 2> >(tail -n 40 > "$RESULTS.err")
  local rc=$?
  if (( rc != 0 )); then
    { echo; echo "**$name failed (exit $rc$( ((rc == 124)) && echo ', out of time'))**; its last lines:"; echo '```'
      cat "$RESULTS.err"; echo '```'; } >> "$RESULTS"
  fi
  echo "    $name: exit $rc, $(( $(date +%s) - t0 )) s" >&2
}

part "GPU warm tier: copy back, first answer, a neighbour's p99" 200 "$PY" bench/gpu/gpu_bench.py

{ echo; echo "## CUDA tests (pytest -m cuda)"; echo; } >> "$RESULTS"
if [[ -n "$gpu" ]]; then
  echo '```' >> "$RESULTS"
  part "CUDA tests" 90 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/unit/replica/test_warm_tier_cuda.py
  echo '```' >> "$RESULTS"
else
  echo "No GPU: skipped (tests/conftest.py deselects them where torch sees no CUDA device)." >> "$RESULTS"
fi

{ echo; echo "## The batched workload on the GPU (GPUBatchedMLP through router and replica, c=64)"; echo; } >> "$RESULTS"
if [[ -n "$gpu" ]]; then
  part "batched workload" 150 "$PY" bench/compare/ab_batched.py --a . --b . --runs 2 --seconds 6 --warmup 2 \
    --handler GPUBatchedMLP --concurrency 64
else
  echo "No GPU: skipped." >> "$RESULTS"
fi

{ echo; echo "## Where a load's time goes, on this machine's CPU (bench/swap/profile_load.py)"; echo; } >> "$RESULTS"
part "load profile" 60 "$PY" bench/swap/profile_load.py --repeat 3

rm -f "$RESULTS.err"
{ echo; echo "Total: $(( $(date +%s) - started )) s."; echo; } >> "$RESULTS"
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then cp "$RESULTS" "$OUT/"; fi
echo "results: $RESULTS" >&2
