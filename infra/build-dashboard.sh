#!/usr/bin/env bash
# Vendor the dashboard's chart library from npm into api/static/vendor/.
#
# The version is pinned by dashboard/package-lock.json; `npm ci` installs exactly that (from the
# npm registry, or offline from npm's cache once it has been fetched). The copied file is
# committed, so a fresh clone serves the dashboard without node or npm; run this after changing
# dashboard/package.json (`make dashboard`), and commit the lock file and the vendored files.
# `--check` only verifies that the committed file is the locked version (no network, no npm).
set -euo pipefail
cd "$(dirname "$0")/.."

VENDOR=api/static/vendor
LIB=dashboard/node_modules/chart.js

locked_version() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["packages"]["node_modules/chart.js"]["version"])' \
        dashboard/package-lock.json
}

vendored_version() {
    sed -n 's/^ \* Chart\.js v\([0-9.]*\)$/\1/p' "$VENDOR/chart.umd.min.js" 2>/dev/null | head -n1
}

if [[ "${1:-}" == "--check" ]]; then
    want="$(locked_version)" have="$(vendored_version)"
    if [[ "$want" != "$have" ]]; then
        echo "build-dashboard: $VENDOR/chart.umd.min.js is Chart.js '${have:-missing}'," \
            "the lock file pins $want: run 'make dashboard' and commit the result" >&2
        exit 1
    fi
    echo "build-dashboard: vendored Chart.js $have matches the lock file"
    exit 0
fi

command -v npm >/dev/null 2>&1 || {
    echo "build-dashboard: error: npm is required (Debian/Ubuntu: apt-get install npm)" >&2
    exit 1
}
(cd dashboard && npm ci --no-audit --no-fund --prefer-offline --loglevel=error)
mkdir -p "$VENDOR"
cp "$LIB/dist/chart.umd.min.js" "$VENDOR/chart.umd.min.js"
cp "$LIB/LICENSE.md" "$VENDOR/chart.js.LICENSE.md"
echo "build-dashboard: vendored Chart.js $(vendored_version) into $VENDOR/"
