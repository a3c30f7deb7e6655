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
echo "constraints.txt updated; review with git diff"
