#!/usr/bin/env bash
# Build the S3-compatible server `ctr s3 up` runs (SeaweedFS's `weed`, Apache-2.0) from the Go
# module proxy, once, into the binary cache:
#   bash infra/seaweedfs.sh            # prints the binary's path
# The module's go.mod has a replace directive, so `go install module@version` refuses it: the
# module's source is downloaded into Go's module cache, copied and built there (about 10 minutes
# and 2 GB of module downloads on 2 cores, the first time only).
set -euo pipefail
cd "$(dirname "$0")/.."

MODULE=github.com/seaweedfs/seaweedfs
# SeaweedFS 4.53 (2026-11-09): the newest the module proxy serves as a pseudo-version.
VERSION=v0.0.0-20261109003541-7506e5f91cd6
#: Folder of the binaries built once (SeaweedFS's weed); default ~/.cache/ctr-lambda/bin
#: (under XDG_CACHE_HOME if set).
root="${CTR_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctr-lambda/bin}"
target="$root/weed-$VERSION"
if [[ -x "$target" ]]; then
    echo "$target"
    exit 0
fi
if ! command -v go > /dev/null 2>&1; then
    echo "seaweedfs: error: the Go toolchain ('go', 1.26 or later) is needed to build the S3 server." >&2
    echo "           Debian/Ubuntu: https://go.dev/doc/install, or set CTR_S3_BINARY to a built weed." >&2
    exit 1
fi
echo "seaweedfs: building weed $VERSION into $root (once; about 10 minutes)" >&2
dir="$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$dir" ]] || { echo "seaweedfs: error: go mod download $MODULE@$VERSION failed" >&2; exit 1; }
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$dir/." "$work/src"
chmod -R u+w "$work/src"
mkdir -p "$root"
(cd "$work/src" && CGO_ENABLED=0 go build -trimpath -o "$target.partial" ./weed) >&2
mv "$target.partial" "$target"
echo "$target"
