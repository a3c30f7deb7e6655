#!/usr/bin/env bash
# The batch layer on a plain loop, for `DEMO_AIRFLOW=0 make demo` (machines where Airflow is too
# heavy): what the ctr_batch DAG does, without a scheduler. Every DEMO_BATCH_MINUTES, on the
# clock (like cron */N), it runs `ctr batch` for the interval that just ended plus
# CTR_BATCH_LOOKBACK_MINUTES before it: at tick T, [T - N - lookback, T); then `ctr batch --stale`
# recomputes what late events made stale (the ctr_recompute_stale DAG's work).
# SIGTERM: a running batch job finishes first (its commit is atomic either way), then it exits.
set -uo pipefail
cd "$(dirname "$0")/.."
CTR=.venv/bin/ctr
minutes="${DEMO_BATCH_MINUTES:-10}"
lookback="${CTR_BATCH_LOOKBACK_MINUTES:-$((2 * minutes))}"
if ! [[ "$minutes" =~ ^[0-9]+$ && "$lookback" =~ ^[0-9]+$ ]] || ((minutes < 1)); then
    echo "batch loop: DEMO_BATCH_MINUTES ($minutes) and CTR_BATCH_LOOKBACK_MINUTES ($lookback)" \
        "must be whole numbers of minutes, at least 1" >&2
    exit 2
fi
step=$((minutes * 60))
stopping=0
sleeper=""
trap 'stopping=1; [[ -n "$sleeper" ]] && kill "$sleeper" 2>/dev/null' TERM INT

iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }

echo "batch loop: every $minutes min, each run [tick - $minutes min - $lookback min, tick)"
while ((!stopping)); do
    tick=$(($(date -u +%s) / step * step + step))
    echo "batch loop: next run at $(iso "$tick")"
    sleep $((tick - $(date -u +%s))) &
    sleeper=$!
    wait "$sleeper"
    sleeper=""
    ((stopping)) && break
    start="$(iso $((tick - step - lookback * 60)))"
    end="$(iso "$tick")"
    echo "batch loop: $(date -u +%H:%M:%S) ctr batch --start $start --end $end"
    # In the foreground: bash runs the TERM trap only after it returns.
    # The exit status is taken at once: the timestamp's command substitution resets $?.
    "$CTR" batch --start "$start" --end "$end"
    status=$?
    if ((status == 0)); then
        echo "batch loop: $(date -u +%H:%M:%S) done"
    else
        echo "batch loop: $(date -u +%H:%M:%S) ctr batch failed (exit $status); next tick retries" >&2
    fi
    ((stopping)) && break
    "$CTR" batch --stale
    status=$?
    if ((status != 0)); then
        echo "batch loop: $(date -u +%H:%M:%S) ctr batch --stale failed (exit $status); next tick retries" >&2
    fi
done
echo "batch loop: stopped"
