#!/usr/bin/env bash
# Stop what `make demo` started: the archiver (gracefully, by pid), then the embedded broker.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${RUN_DIR:-run}"
pid_file="$RUN_DIR/archiver.pid"
if [[ -f "$pid_file" ]]; then
    pid="$(cat "$pid_file")"
    if kill -TERM "$pid" 2>/dev/null; then
        echo "demo: stopping the archiver (pid $pid)"
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
fi
[[ -x .venv/bin/ctr ]] && .venv/bin/ctr kafka down
