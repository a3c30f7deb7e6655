#!/usr/bin/env bash
# make demo's history, in the background (infra/demo.sh starts it; its log: $DEMO/history.log).
# The traffic generator sends the history itself, as the backlog of its one stream (its clock
# starts HISTORY_START, the records up to now go at once, then it keeps DEMO_RATE: no seam
# between the history and the live traffic, and the history's last clicks come in their time).
# This script:
#  1. waits until the archiver has taken the history in (master/events holds an event from
#     HISTORY_END on), then half a minute more for the slower partitions;
#  2. makes the history's settled minutes exact with one `ctr batch` (what the archiver takes
#     in after that run read is stale, and ctr_recompute_stale or the batch loop make it exact);
#  3. then unpauses the DAGs in UNPAUSE_AFTER (ctr_batch): its scheduled runs would otherwise
#     recompute the same minutes beside this run, twice the work on a small machine.
# Settings from infra/demo.sh: HISTORY_START, HISTORY_END, UNPAUSE_AFTER,
# AIRFLOW_HOME, AIRFLOW_PORT, and the lake's (LAKE_ROOT, ...).
set -uo pipefail
cd "$(dirname "$0")/.."
CTR=.venv/bin/ctr

say() { echo "history: $(date -u +%H:%M:%S) $*"; }

archived() {
    local since="${HISTORY_END/T/ }"
    "$CTR" sql -f csv "SELECT count(*) AS n FROM events WHERE event_time >= TIMESTAMP '${since%Z}'" \
        2> /dev/null | tr -d '\r' | tail -n 1 | grep -qE '^[1-9][0-9]*$'  # CSV lines end in CRLF
}

say "waiting for the archiver to take in the history ($HISTORY_START to $HISTORY_END)"
for _ in $(seq 60); do  # up to 10 minutes
    archived && break
    sleep 10
done
archived || say "the history is not all archived after 10 min; making what is there exact"
sleep 30
end="$(date -u +%Y-%m-%dT%H:%M:00Z)"
say "ctr batch --start $HISTORY_START --end $end"
"$CTR" batch --start "$HISTORY_START" --end "$end" \
    || say "error: the history's batch run failed (exit $?); the scheduled runs go on"
#: Set by infra/demo.sh: the Airflow DAGs to unpause once the history's batch run is done
#: (ctr_batch; empty without Airflow).
if [[ -n "${UNPAUSE_AFTER:-}" ]]; then
    url="http://127.0.0.1:${AIRFLOW_PORT:-8080}"
    for _ in $(seq 300); do  # Airflow starts beside the history: up to 5 minutes more
        curl -fsS -o /dev/null "$url/api/v2/monitor/health" 2> /dev/null && break
        sleep 1
    done
    # shellcheck disable=SC2086
    .venv/bin/python -m infra.airflow_api unpause --url "$url" $UNPAUSE_AFTER \
        && say "$UNPAUSE_AFTER unpaused: its scheduled runs take over"
fi
say "done"
