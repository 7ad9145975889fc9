#!/usr/bin/env bash
# Build (or reuse) the node's NetworkPolicy agent: kube-router from its Go module
# github.com/cloudnativelabs/kube-router/v2 (the node runs only its firewall: iptables + ipset).
#
# The version is pinned in policy-agent.env beside this script. The binary lands in
#   ${MODELPLEX_CACHE:-$HOME/.cache/modelplex}/policy-agent/<hash>/bin/kube-router
# where <hash> covers policy-agent.env and this recipe only: it is cached apart from build.sh's
# binaries, whose cache key it leaves alone. Progress goes to stderr; the bin folder is the
# only thing written to stdout: BIN=$(hack/control-plane/build-policy-agent.sh)
#
# Usage: build-policy-agent.sh [--force]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Bump when the way the binary is built changes (flags, ldflags, layout).
RECIPE=1

force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-policy-agent.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { printf '%s\n' "$*" >&2; }
die() { printf 'build-policy-agent.sh: error: %s\n' "$*" >&2; exit 1; }

KUBE_ROUTER_VERSION=""
while IFS='=' read -r key value; do
  case "$key" in
    KUBE_ROUTER_VERSION) KUBE_ROUTER_VERSION="${value//[[:space:]]/}" ;;
    ''|\#*) ;;
    *) die "unexpected line in policy-agent.env: $key=$value" ;;
  esac
done < "$HERE/policy-agent.env"
[[ "$KUBE_ROUTER_VERSION" =~ ^2\.[0-9]+\.[0-9]+$ ]] || die "KUBE_ROUTER_VERSION must look like 2.1.0, got '$KUBE_ROUTER_VERSION'"

KEY="$( (echo "recipe=$RECIPE"; cat "$HERE/policy-agent.env") | sha256sum | cut -c1-16)"
OUT="${MODELPLEX_CACHE:-$HOME/.cache/modelplex}/policy-agent/$KEY"
BIN="$OUT/bin"
summary="kube-router $KUBE_ROUTER_VERSION"

if (( ! force )) && [[ -f "$OUT/.complete" && -x "$BIN/kube-router" ]]; then
  log "==> policy agent up to date ($summary): $BIN"
  echo "$BIN"
  exit 0
fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if (( ! force )) && [[ -f "$OUT/.complete" && -x "$BIN/kube-router" ]]; then
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null 2>&1 || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null 2>&1 || die "no Go toolchain found (need go >= 1.22 on PATH or in /usr/local/go)"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-buildvcs=false"
rm -rf "$OUT/.complete" "$OUT/bin.partial"
mkdir -p "$OUT/bin.partial"
t0=$(date +%s)
log "==> building $summary with $(go version) (cold build takes ~6 min on 2 cores; less with a warm Go build cache)"
# `go install module@version`: the module's own go.mod decides every dependency, checked
# against sum.golang.org; nothing is vendored or patched.
pkg=github.com/cloudnativelabs/kube-router/v2
GOBIN="$OUT/bin.partial" go install -trimpath \
  -ldflags="-s -w -X $pkg/pkg/version.Version=v$KUBE_ROUTER_VERSION -X $pkg/pkg/version.BuildDate=1970-01-01T00:00:00Z" \
  "$pkg/cmd/kube-router@v$KUBE_ROUTER_VERSION" >&2 || die "building $summary failed"
rm -rf "$BIN"
mv "$OUT/bin.partial" "$BIN"
touch "$OUT/.complete"
log "==> built $summary in $(( $(date +%s) - t0 ))s: $BIN"
echo "$BIN"
