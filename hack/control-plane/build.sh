#!/usr/bin/env bash
# Build (or reuse) the binaries of Modelplex's local Kubernetes cluster:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and
# kubectl from the k8s.io/kubernetes Go module (one version for all), etcd from
# go.etcd.io/etcd/server/v3, helm from helm.sh/helm/v3, CoreDNS from
# github.com/coredns/coredns (with the plugins the node uses: modules/coredns/main.go).
#
# Versions are pinned in versions.env beside this script. Binaries land in
#   ${MODELPLEX_CACHE:-$HOME/.cache/modelplex}/control-plane/<hash>/bin/
# where <hash> covers versions.env and the go.mod templates, so a warm run only
# checks that the binaries are there. Progress goes to stderr; the bin folder is
# the only thing written to stdout, for scripts: BIN=$(hack/control-plane/build.sh)
#
# Usage: build.sh [--force] [--print-cache-key]
#   --force            rebuild even when the cached binaries exist
#   --print-cache-key  print the cache folder for the pinned versions and exit
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Bump when the way binaries are built changes (flags, ldflags, layout), so that
# caches made by an older recipe are not reused.
RECIPE=2
TOOLS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl helm coredns)

force=0
print_key=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --print-cache-key) print_key=1 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { printf '%s\n' "$*" >&2; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

# --- versions ---------------------------------------------------------------
# Read KEY=VALUE lines only (no sourcing of arbitrary shell).
KUBERNETES_VERSION="" ETCD_VERSION="" HELM_VERSION="" COREDNS_VERSION=""
while IFS='=' read -r key value; do
  case "$key" in
    KUBERNETES_VERSION|ETCD_VERSION|HELM_VERSION|COREDNS_VERSION) printf -v "$key" '%s' "${value//[[:space:]]/}" ;;
    ''|\#*) ;;
    *) die "unexpected line in versions.env: $key=$value" ;;
  esac
done < "$HERE/versions.env"
[[ "$KUBERNETES_VERSION" =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "KUBERNETES_VERSION must look like 1.33.4, got '$KUBERNETES_VERSION'"
[[ "$ETCD_VERSION" =~ ^3\.[0-9]+\.[0-9]+$ ]] || die "ETCD_VERSION must look like 3.5.21, got '$ETCD_VERSION'"
[[ "$HELM_VERSION" =~ ^3\.[0-9]+\.[0-9]+$ ]] || die "HELM_VERSION must look like 3.17.4, got '$HELM_VERSION'"
[[ "$COREDNS_VERSION" =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "COREDNS_VERSION must look like 1.15.0, got '$COREDNS_VERSION'"
# k8s.io/kubernetes v1.X.Y publishes its staging modules as v0.X.Y.
STAGING_VERSION="0.${KUBERNETES_VERSION#1.}"
KUBE_MINOR="${KUBERNETES_VERSION#1.}"; KUBE_MINOR="${KUBE_MINOR%%.*}"

# --- cache location -----------------------------------------------------------
key_input() {
  echo "recipe=$RECIPE"
  cat "$HERE/versions.env"
  (cd "$HERE/modules" && find . -type f | LC_ALL=C sort | while read -r f; do echo "== $f"; cat "$f"; done)
}
KEY="$(key_input | sha256sum | cut -c1-16)"
CACHE_ROOT="${MODELPLEX_CACHE:-$HOME/.cache/modelplex}"
OUT="$CACHE_ROOT/control-plane/$KEY"
BIN="$OUT/bin"
if (( print_key )); then echo "$OUT"; exit 0; fi

have_all() {
  [[ -f "$OUT/.complete" ]] || return 1
  local t
  for t in "${TOOLS[@]}"; do [[ -x "$BIN/$t" ]] || return 1; done
}

summary="Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION, CoreDNS $COREDNS_VERSION"
start_all=$(date +%s)
if (( ! force )) && have_all; then
  log "==> control-plane binaries up to date ($summary): $BIN"
  echo "$BIN"
  exit 0
fi

# --- cold build ---------------------------------------------------------------
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
if ! flock -n 9; then
  log "==> another build of $OUT is running; waiting for it"
  flock 9
fi
# The other build may have finished while we waited.
if (( ! force )) && have_all; then
  log "==> control-plane binaries up to date ($summary): $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null 2>&1 || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null 2>&1 || die "no Go toolchain found (need go >= 1.23 on PATH or in /usr/local/go)"
log "==> using $(go version)"

export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"
export GOTOOLCHAIN=local
GO_BUILD=(go build -trimpath)

SRC="$OUT/src"
rm -rf "$SRC" "$OUT/bin.partial" "$OUT/.complete"
mkdir -p "$SRC" "$OUT/bin.partial"
PARTIAL="$OUT/bin.partial"

render() { # render TEMPLATE_DIR DEST_DIR
  mkdir -p "$2"
  local f
  for f in "$1"/*; do
    local name; name="$(basename "$f")"
    sed -e "s/@KUBERNETES_VERSION@/$KUBERNETES_VERSION/g" \
        -e "s/@STAGING_VERSION@/$STAGING_VERSION/g" \
        -e "s/@ETCD_VERSION@/$ETCD_VERSION/g" \
        -e "s/@HELM_VERSION@/$HELM_VERSION/g" \
        -e "s/@COREDNS_VERSION@/$COREDNS_VERSION/g" \
        "$f" > "$2/${name%.in}"
  done
}

step() { # step NAME VERSION ESTIMATE DIR PACKAGES LDFLAGS (several packages: binaries named after them)
  local name="$1" version="$2" estimate="$3" dir="$4" pkg="$5" ldflags="$6"
  local t0; t0=$(date +%s)
  log "==> building $name $version (cold build takes ~$estimate on 2 cores; less with a warm Go build cache)"
  local -a pkgs; read -r -a pkgs <<< "$pkg"
  local out="$PARTIAL/$name"
  (( ${#pkgs[@]} == 1 )) || out="$PARTIAL/"  # several main packages: each binary under its own name
  (cd "$dir" && "${GO_BUILD[@]}" -ldflags="-s -w $ldflags" -o "$out" "${pkgs[@]}") \
    || die "building $name failed (work dir: $dir)"
  log "    $name built in $(( $(date +%s) - t0 ))s"
}

render "$HERE/modules/kubernetes" "$SRC/kubernetes"
render "$HERE/modules/etcd" "$SRC/etcd"
render "$HERE/modules/helm" "$SRC/helm"
render "$HERE/modules/coredns" "$SRC/coredns"

t0=$(date +%s)
log "==> downloading Go modules ($summary)"
# The go.mod files only name the top module; resolve the rest of the graph and
# write go.sum (checked against sum.golang.org by the go command).
(cd "$SRC/kubernetes" && go get "k8s.io/kubernetes/cmd/kube-apiserver@v$KUBERNETES_VERSION" \
   "k8s.io/kubernetes/cmd/kube-controller-manager@v$KUBERNETES_VERSION" \
   "k8s.io/kubernetes/cmd/kube-scheduler@v$KUBERNETES_VERSION" \
   "k8s.io/kubernetes/cmd/kubelet@v$KUBERNETES_VERSION" \
   "k8s.io/kubernetes/cmd/kube-proxy@v$KUBERNETES_VERSION" \
   "k8s.io/kubernetes/cmd/kubectl@v$KUBERNETES_VERSION" >&2) || die "resolving k8s.io/kubernetes failed"
(cd "$SRC/etcd" && go mod tidy >&2) || die "resolving etcd failed"
(cd "$SRC/helm" && go get "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" >&2) || die "resolving helm failed"
(cd "$SRC/coredns" && go mod tidy >&2) || die "resolving CoreDNS failed"
log "    modules ready in $(( $(date +%s) - t0 ))s"

# Version stamps, as Kubernetes' own hack/lib/version.sh sets them.
kube_ld=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ld+=" -X $p.gitVersion=v$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$KUBE_MINOR"
  kube_ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

step etcd "$ETCD_VERSION" "1 min" "$SRC/etcd" "." ""
# The six Kubernetes binaries in one go build: it compiles their shared packages once and links
# one binary while it compiles the next one's packages (six builds in a row leave a core idle
# during each link).
step "kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl" \
  "$KUBERNETES_VERSION" "15 min" "$SRC/kubernetes" "$(printf 'k8s.io/kubernetes/cmd/%s ' \
  kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)" "$kube_ld"
step helm "$HELM_VERSION" "2 min" "$SRC/helm" helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
step coredns "$COREDNS_VERSION" "4 min" "$SRC/coredns" "." \
  "-X github.com/coredns/coredns/coremain.GitCommit=v$COREDNS_VERSION"

rm -rf "$BIN"
mv "$PARTIAL" "$BIN"
cat > "$OUT/versions.env" <<EOF
KUBERNETES_VERSION=$KUBERNETES_VERSION
ETCD_VERSION=$ETCD_VERSION
HELM_VERSION=$HELM_VERSION
COREDNS_VERSION=$COREDNS_VERSION
GO_VERSION=$(go env GOVERSION)
EOF
touch "$OUT/.complete"
log "==> built $summary in $(( $(date +%s) - start_all ))s: $BIN"
echo "$BIN"
