#!/usr/bin/env bash
# Vendor the dashboard's chart library and /docs' Swagger UI from npm into api/static/vendor/.
#
# The versions are pinned by dashboard/package-lock.json; `npm ci` installs exactly those (from
# the npm registry, or offline from npm's cache once they have been fetched), without running
# their install scripts (swagger-ui-dist's @scarf/scarf would report the install over the
# network). The copied files are committed, so a fresh clone serves the dashboard and /docs
# without node or npm; run this after changing dashboard/package.json (`make dashboard`), and
# commit the lock file and the vendored files.
# `--check` only verifies that the committed files are the locked versions (no network, no npm).
set -euo pipefail
cd "$(dirname "$0")/.."

VENDOR=api/static/vendor
MODULES=dashboard/node_modules
# Swagger UI: the bundle (React and the rest inside), its stylesheet and favicon, and the
# licences: Apache-2.0 with its NOTICE, and those of the libraries the bundle holds.
SWAGGER_FILES=(swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css favicon-32x32.png LICENSE NOTICE)

locked_version() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["packages"]["node_modules/" + sys.argv[2]]["version"])' \
        dashboard/package-lock.json "$1"
}

# The version each vendored file names: Chart.js in its banner, Swagger UI in its build info.
vendored_version() {
    case "$1" in
        chart.js) sed -n 's/^ \* Chart\.js v\([0-9.]*\)$/\1/p' "$VENDOR/chart.umd.min.js" 2>/dev/null | head -n1 ;;
        swagger-ui-dist) grep -o 'PACKAGE_VERSION:"[0-9.]*"' "$VENDOR/swagger-ui/swagger-ui-bundle.js" 2>/dev/null \
            | head -n1 | sed 's/.*"\([0-9.]*\)"/\1/' ;;
    esac
}

if [[ "${1:-}" == "--check" ]]; then
    status=0
    for package in chart.js swagger-ui-dist; do
        want="$(locked_version "$package")" have="$(vendored_version "$package")"
        if [[ "$want" != "$have" ]]; then
            echo "build-dashboard: $VENDOR holds $package '${have:-missing}', the lock file pins" \
                "$want: run 'make dashboard' and commit the result" >&2
            status=1
        else
            echo "build-dashboard: vendored $package $have matches the lock file"
        fi
    done
    for file in "${SWAGGER_FILES[@]}"; do
        [[ -f "$VENDOR/swagger-ui/$file" ]] || {
            echo "build-dashboard: $VENDOR/swagger-ui/$file is missing: run 'make dashboard'" >&2
            status=1
        }
    done
    exit "$status"
fi

command -v npm >/dev/null 2>&1 || {
    echo "build-dashboard: error: npm is required (Debian/Ubuntu: apt-get install npm)" >&2
    exit 1
}
(cd dashboard && npm ci --ignore-scripts --no-audit --no-fund --prefer-offline --loglevel=error)
mkdir -p "$VENDOR/swagger-ui"
cp "$MODULES/chart.js/dist/chart.umd.min.js" "$VENDOR/chart.umd.min.js"
cp "$MODULES/chart.js/LICENSE.md" "$VENDOR/chart.js.LICENSE.md"
for file in "${SWAGGER_FILES[@]}"; do
    cp "$MODULES/swagger-ui-dist/$file" "$VENDOR/swagger-ui/$file"
done
echo "build-dashboard: vendored Chart.js $(vendored_version chart.js)" \
    "and Swagger UI $(vendored_version swagger-ui-dist) into $VENDOR/"
