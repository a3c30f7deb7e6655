#!/usr/bin/env bash
# Create .venv with the pinned dependency set (constraints.txt) and the project installed
# in editable mode. Idempotent: when nothing changed since the last run it only checks.
#
# pyspark is published only as a large sdist that pip would rebuild in every new venv, so it
# is built once into a wheel cache outside the repository and installed from there. The JVM
# parts (the Kafka broker) come from Maven Central into a jar cache the same way.
set -euo pipefail
cd "$(dirname "$0")/.."

#: The Python that creates .venv; default python3.11, else python3.
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
#: Folder of the wheels built once (pyspark's) that the install takes from; default
#: ~/.cache/ctr-lambda/wheels (under XDG_CACHE_HOME if set).
WHEEL_CACHE="${CTR_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctr-lambda/wheels}"
STAMP=.venv/.ctr-setup-stamp
# The uv that installs the dependency set into .venv (pinned: the stamp below names it).
UV_VERSION=0.13.9

# Spark 4 runs on Java 17 or 21 (Kafka 4 on 17+); fail early with a message rather than deep
# inside Spark or the broker.
if ! command -v java >/dev/null 2>&1; then
    echo "setup: error: Java 17 is required by Spark but 'java' is not on PATH." >&2
    echo "       Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless" >&2
    exit 1
fi
java_major="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
if [[ "$java_major" != "17" && "$java_major" != "21" ]]; then
    echo "setup: error: Spark 4 needs Java 17 (or 21); 'java' is version ${java_major:-unknown}." >&2
    echo "       Install openjdk-17-jre-headless and put it first on PATH (or set JAVA_HOME)." >&2
    exit 1
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    echo "setup: error: Python 3.11 is required (found $("$PYTHON" --version 2>&1))." >&2
    exit 1
}

# Apache Kafka's broker jars (and the Spark connectors', and PostgreSQL's JDBC driver the
# PostgreSQL endpoint's tests use), resolved by Maven into a cache outside the repository once; a
# no-op when they are there.
bash infra/jars.sh kafka spark s3 pgjdbc
# The S3-compatible server `ctr s3 up` runs (SeaweedFS) is not built here: the plain demo needs no
# Go. `make seaweedfs` builds it once (make test, make demo-cluster and make s3-up do first), and
# `ctr s3 up` builds it on first use.

want="$( (cat constraints.txt pyproject.toml; echo "uv $UV_VERSION") | sha256sum | cut -d' ' -f1)"
if [[ -x .venv/bin/ctr && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    echo "setup: .venv is up to date"
    exit 0
fi

[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv

pyspark_version="$(sed -n 's/^pyspark==//p' constraints.txt)"
mkdir -p "$WHEEL_CACHE"
if ! compgen -G "$WHEEL_CACHE/pyspark-${pyspark_version}-*.whl" >/dev/null; then
    echo "setup: building the pyspark ${pyspark_version} wheel once into $WHEEL_CACHE (about a minute)"
    # PEP 517, in an isolated build environment: a fresh venv has no `wheel` package for the
    # sdist's setup.py (pip: "invalid command 'bdist_wheel'").
    .venv/bin/pip wheel --quiet --use-pep517 --no-deps "pyspark==${pyspark_version}" -w "$WHEEL_CACHE"
fi

echo "setup: installing the pinned dependency set into .venv"
# uv installs the same set as pip (the same versions: constraints.txt) in about 7 s where pip
# took 93 s on a 2-core machine: every fresh clone's set-up, CI's every run. pip installs uv
# itself into .venv; uv reads the system's certificates (UV_NATIVE_TLS), as pip does.
# This machine's pip configuration names optional local indexes that may not exist; their
# "is ignored" warnings are noise.
.venv/bin/pip install --quiet "uv==${UV_VERSION}" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
UV_NATIVE_TLS=1 .venv/bin/uv pip install --quiet --python .venv/bin/python \
    --find-links "$WHEEL_CACHE" -c constraints.txt -e '.[dev]'
echo "$want" > "$STAMP"
echo "setup: done (.venv/bin/ctr --help)"
