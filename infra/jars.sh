#!/usr/bin/env bash
# Resolve the JVM dependencies named by infra/<set>/pom.xml into the jar cache, once:
#   bash infra/jars.sh kafka
# The cache directory is named after the POM's hash (runtime/jars.py finds it the same way), so
# a changed POM gets a fresh directory and every clone and venv shares the jars. Maven resolves
# with the machine's own settings (~/.m2/settings.xml, /etc/maven/settings.xml).
set -euo pipefail
cd "$(dirname "$0")/.."

for set in "$@"; do
    pom="infra/$set/pom.xml"
    [[ -f "$pom" ]] || { echo "jars: error: no $pom" >&2; exit 2; }
    root="${CTR_JAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctr-lambda/jars}"
    hash="$(sha256sum "$pom" | cut -c1-12)"
    target="$root/$set-$hash"
    [[ -f "$target/.complete" ]] && continue
    if ! command -v mvn > /dev/null 2>&1; then
        echo "jars: error: Maven ('mvn') is needed to fetch the $set jars from Maven Central." >&2
        echo "      Debian/Ubuntu: sudo apt-get install maven" >&2
        exit 1
    fi
    echo "jars: resolving $pom into $target (once)"
    rm -rf "$target.partial"
    mkdir -p "$target.partial"
    log="$(mktemp)"
    if ! mvn -B -q -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$(cd "$target.partial" && pwd)" > "$log" 2>&1; then
        echo "jars: error: Maven could not resolve $pom:" >&2
        grep -E 'ERROR|Could not|resolve' "$log" | head -5 | sed 's/^/      /' >&2
        echo "      Is Maven Central reachable (a proxy or mirror in ~/.m2/settings.xml)? Full log: $log" >&2
        exit 1
    fi
    rm -f "$log"
    touch "$target.partial/.complete"
    rm -rf "$target"
    mv "$target.partial" "$target"
done
