#!/usr/bin/env bash
# Fetch Prometheus, its Pushgateway and its node exporter (Debian 12's packages, Apache-2.0)
# once into the binary cache, unpacked, not installed: no service is started and no root is
# needed when the package lists are there (`make demo` runs them; `make test` runs promtool
# on the shipped rules):
#   bash infra/prometheus.sh            # prints the folder holding the binaries
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian 12 (bookworm)'s versions: their files are named by them.
PACKAGES=(prometheus prometheus-pushgateway prometheus-node-exporter)
#: Folder of the binaries fetched once (SeaweedFS's weed, Prometheus'); default
#: ~/.cache/ctr-lambda/bin (under XDG_CACHE_HOME if set).
root="${CTR_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctr-lambda/bin}"
target="$root/prometheus-debian12"
#: A folder holding prometheus, promtool, prometheus-pushgateway and prometheus-node-exporter
#: already (your own install): used instead of fetching Debian's packages.
if [[ -n "${CTR_PROMETHEUS_BIN:-}" ]]; then
    echo "$CTR_PROMETHEUS_BIN"
    exit 0
fi
if [[ -x "$target/usr/bin/promtool" && -x "$target/usr/bin/prometheus-pushgateway" \
      && -x "$target/usr/bin/prometheus-node-exporter" ]]; then
    echo "$target/usr/bin"
    exit 0
fi
command -v apt-get > /dev/null 2>&1 || {
    echo "prometheus: error: apt-get is needed to fetch Debian's prometheus packages;" \
         "install prometheus (2.42 or later) and set CTR_PROMETHEUS_BIN to its folder" >&2
    exit 1
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download -q "${PACKAGES[@]}" > /dev/null 2>&1; then
    # No package lists yet (a fresh machine): read them once, as root.
    SUDO=""
    [[ "$(id -u)" != 0 ]] && SUDO=sudo
    echo "prometheus: reading the Debian package lists (apt-get update)" >&2
    $SUDO apt-get update -qq
    apt-get download -q "${PACKAGES[@]}" > /dev/null
fi
mkdir -p "$root"
rm -rf "$target.partial"
for deb in ./*.deb; do dpkg-deb -x "$deb" "$target.partial"; done
rm -rf "$target"
mv "$target.partial" "$target"
echo "$target/usr/bin"
