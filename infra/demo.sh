#!/usr/bin/env bash
# `make demo`: broker and topics, the archiver in the background, generated traffic in the
# foreground until Ctrl-C; then everything it started is stopped (also by `make demo-down`).
set -uo pipefail
cd "$(dirname "$0")/.."
CTR=.venv/bin/ctr
RUN_DIR="${RUN_DIR:-run}"
mkdir -p "$RUN_DIR"

"$CTR" kafka up || exit 1
"$CTR" archive > "$RUN_DIR/archiver.log" 2>&1 &
echo $! > "$RUN_DIR/archiver.pid"
echo "demo: archiver running (log $RUN_DIR/archiver.log), writing ${LAKE_ROOT:-data/lake}"
echo "demo: producing ${DEMO_RATE:-200} events/s into ${KAFKA_TOPIC:-ad-events}; Ctrl-C to stop"
echo "demo: meanwhile, in another shell: .venv/bin/ctr kafka status"

trap 'true' INT TERM  # Ctrl-C stops the producer (it flushes and reports), then we clean up
"$CTR" produce --rate "${DEMO_RATE:-200}" --duplicates 0.01 --late 0.02 --malformed 0.005
bash infra/demo-down.sh
