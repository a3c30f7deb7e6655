#!/usr/bin/env bash
# infra/supervise.sh NAME COMMAND [ARGS...]: run COMMAND, and start it again whenever it exits
# or dies (a crash, an OOM kill, SIGKILL), until this loop itself gets SIGTERM or SIGINT.
# `make demo` runs its long-lived components under it (the archiver, the speed job, the API,
# the traffic generator, the batch loop, the broker watch).
#
# - The restart waits 1 s, doubling up to 30 s while the command keeps dying within a minute of
#   its start (a crash loop does not spin), back to 1 s once it has run a minute.
# - Exit status 2 is a usage error (bad flag or setting): starting again would fail the same way,
#   so the loop ends with it.
# - SIGTERM/SIGINT: passed on to the command, which drains and commits as it does when run by
#   hand; the loop waits for it and exits with its status.
# - SUPERVISE_DIR (if set) receives NAME.child.pid (the running command's pid: what a chaos
#   round kills) and one line per restart in restarts.log: "epoch NAME status seconds-run".
# The command inherits this loop's process group: stopping the group stops both.
set -uo pipefail
if (($# < 2)); then
    echo "usage: infra/supervise.sh NAME COMMAND [ARGS...]" >&2
    exit 2
fi
name="$1"
shift
#: A folder for NAME.child.pid and restarts.log (a line per restart; infra/airflow-up.sh's
#: components too); unset: neither is written.
dir="${SUPERVISE_DIR:-}"
child=""
stopping=0
trap 'stopping=1; [[ -n "$child" ]] && kill -TERM "$child" 2> /dev/null' TERM INT

backoff=1
status=0
while ((!stopping)); do
    started=$(date +%s)
    "$@" < /dev/null &
    child=$!
    [[ -n "$dir" ]] && echo "$child" > "$dir/$name.child.pid"
    # wait returns early when a trapped signal arrives: wait again until the command is gone.
    wait "$child"
    status=$?
    while kill -0 "$child" 2> /dev/null; do
        wait "$child"
        status=$?
    done
    child=""
    ((stopping)) && break
    ran=$(($(date +%s) - started))
    if ((status == 2)); then
        echo "supervise: $name: usage error (exit 2) after ${ran} s; not restarting" >&2
        break
    fi
    ((ran >= 60)) && backoff=1
    echo "supervise: $name exited with status $status after ${ran} s; restarting in ${backoff} s" >&2
    [[ -n "$dir" ]] && echo "$(date +%s) $name $status $ran" >> "$dir/restarts.log"
    sleep "$backoff" &
    wait $!
    backoff=$((backoff * 2 > 30 ? 30 : backoff * 2))
done
[[ -n "$dir" ]] && rm -f "$dir/$name.child.pid"
exit "$status"
