#!/usr/bin/env bash
# Install the Debian packages some targets need (kcat for the ingest benchmark), if missing.
set -euo pipefail
missing=()
for pkg in "$@"; do
    case "$pkg" in
        kcat) command -v kcat >/dev/null 2>&1 || missing+=(kcat) ;;
        chromium) command -v chromium >/dev/null 2>&1 || missing+=(chromium) ;;
        *) dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg") ;;
    esac
done
((${#missing[@]} == 0)) && exit 0
if [[ "$(id -u)" != 0 ]] && ! command -v sudo >/dev/null 2>&1; then
    echo "error: please install the Debian packages: ${missing[*]}" >&2
    exit 1
fi
SUDO=""
[[ "$(id -u)" != 0 ]] && SUDO=sudo
echo "installing Debian packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
