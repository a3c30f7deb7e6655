#!/usr/bin/env bash
# make demo's traffic generator (under infra/supervise.sh): "$@" is the `ctr produce` command.
# On a fresh lake its first start begins the stream's clock at HISTORY_START, so the history is
# the backlog it sends at once before the live traffic (ctr produce --rate with a past
# --start); a restart after a crash goes on from now, without sending the history again.
set -uo pipefail
marker="${DEMO:?}/history-started"
#: Set by infra/demo.sh on a fresh lake: the event time the demo's traffic stream starts at (its
#: history); empty: now.
if [[ -n "${HISTORY_START:-}" && ! -e "$marker" ]]; then
    : > "$marker"
    exec "$@" --start "$HISTORY_START"
fi
exec "$@"
