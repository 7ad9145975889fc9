#!/usr/bin/env bash
# Install the Debian packages the local node runs on, where they are missing:
# containerd, runc and the CNI plugins (the node), catatonit (its pause image),
# iptables (kube-proxy), ipset (the NetworkPolicy agent, kube-router), busybox-static (the
# node tests' image), docker.io + debootstrap (building the project's images), and chromium (the headless browser of the
# CORS and EventSource tests). Needs root and apt-get.
set -euo pipefail
PACKAGES=(containerd runc containernetworking-plugins catatonit iptables ipset busybox-static docker.io debootstrap chromium)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
(( ${#missing[@]} )) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "node-packages.sh: missing Debian packages: ${missing[*]} (install them as root: apt-get install -y ${missing[*]})" >&2
  exit 1
fi
echo "==> installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
