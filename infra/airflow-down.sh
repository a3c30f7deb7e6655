#!/usr/bin/env bash
# `make airflow-down`: stop the Airflow components started by `make airflow-up` (its process group).
set -uo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${RUN_DIR:-run}"
PID_FILE="$RUN_DIR/airflow.pid"
if [[ ! -f "$PID_FILE" ]] || ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
    echo "airflow: not running"; rm -f "$PID_FILE"; exit 0
fi
pid="$(cat "$PID_FILE")"
kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
kill -KILL -- "-$pid" 2>/dev/null || true
rm -f "$PID_FILE"
echo "airflow: stopped"
