#!/usr/bin/env bash
# Re-resolve the pinned dependency set: install pyproject's direct dependencies into a scratch
# venv and freeze it into constraints.txt. Review the diff before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL_CACHE="${CTR_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctr-lambda/wheels}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3.11 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet --find-links "$WHEEL_CACHE" '.[dev]' \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
{
    echo "# Pinned dependency set for ctr-lambda: every package, resolved together with Python 3.11."
    echo "# Regenerate with 'make lock' after changing dependencies in pyproject.toml."
    "$scratch/venv/bin/pip" freeze --exclude ctr-lambda
} > constraints.txt
# The set must install on Debian 12's own Python (3.11.2), not only on the newer 3.11 that made
# it: a package asking for a later 3.11 breaks a fresh machine's make setup (the demo's and
# CI's machines keep a newer Python, so nothing else would say so).
"$scratch/venv/bin/pip" install --quiet "uv==$(sed -n 's/^UV_VERSION=//p' infra/setup.sh)"
echo "-e .[dev]" | UV_SYSTEM_CERTS=1 "$scratch/venv/bin/uv" pip compile --quiet \
    --python-version 3.11.2 --find-links "$WHEEL_CACHE" -c constraints.txt - -o /dev/null || {
    echo "lock: error: the new set does not install on Python 3.11.2 (Debian 12's); pin the" \
        "package named above to a version that does, in pyproject.toml, and lock again" >&2
    exit 1
}
echo "constraints.txt updated; review with git diff"
