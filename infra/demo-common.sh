# Shared by infra/demo.sh and infra/demo-down.sh (sourced, not run): where the demo keeps its
# state, and how it recognises and stops the processes it started.
#
# Every process the demo starts runs in its own process group (setsid) with its pid in
# $DEMO/<name>.pid and the environment variable CTR_DEMO_RUN=<this run's id>, which the kernel
# keeps in /proc/PID/environ. A pid is only signalled when that marker is there: a pid file left
# behind by a crash may by now name somebody else's process.

RUN_DIR="$(mkdir -p "${RUN_DIR:-run}" && cd "${RUN_DIR:-run}" && pwd)"
DEMO="$RUN_DIR/demo"
# What `make demo` starts, in the order `make demo-down` stops it (Airflow and broker apart).
DEMO_PROCESSES=(broker-watch history producer archiver speed api alerts batch-loop batch-history
    prometheus pushgateway node-exporter)

say() { echo "demo: $*"; }

# The run id recorded by the running (or last) demo, empty if none.
demo_run_id() { cat "$DEMO/run-id" 2>/dev/null || true; }

# Pids of the members of process group $1.
group_members() { ps -eo pid=,pgid= | awk -v g="$1" '$2 == g { print $1 }'; }

# True if pid $1 carries CTR_DEMO_RUN=$2 in its environment.
has_marker() {
    [[ -n "$2" ]] && tr '\0' '\n' 2> /dev/null < "/proc/$1/environ" | grep -qxF "CTR_DEMO_RUN=$2"
}

# True if process group $1 (its leader, or any member left after the leader exited) is ours.
group_is_ours() {
    local member
    for member in $(group_members "$1"); do
        has_marker "$member" "$2" && return 0
    done
    return 1
}

# The pid recorded for component $1, if its process group is alive and ours.
live_pid() {
    local file="$DEMO/$1.pid" pid
    [[ -f "$file" ]] || return 1
    pid="$(cat "$file")"
    [[ "$pid" =~ ^[0-9]+$ ]] && group_is_ours "$pid" "$(demo_run_id)" && echo "$pid"
}

# Stop component $1 (pid file $DEMO/$1.pid): SIGTERM to the leader, up to $2 seconds for it to
# finish (flush, drain, commit), then SIGTERM and at last SIGKILL to what is left of its group.
stop_component() {
    local name="$1" grace="$2" file="$DEMO/$1.pid" pid run_id
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file")"
    run_id="$(demo_run_id)"
    if ! [[ "$pid" =~ ^[0-9]+$ ]] || [[ -z "$(group_members "$pid")" ]]; then
        say "$name: not running"
        rm -f "$file"
        return 0
    fi
    if ! group_is_ours "$pid" "$run_id"; then
        say "$name: pid $pid is not a process of this demo (no CTR_DEMO_RUN=$run_id); left alone"
        rm -f "$file"
        return 0
    fi
    say "$name: stopping (pid $pid)"
    kill -TERM "$pid" 2> /dev/null
    local waited=0
    while kill -0 "$pid" 2> /dev/null && ((waited < grace * 2)); do
        sleep 0.5
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2> /dev/null; then
        say "$name: still running after ${grace} s, terminating its process group"
    fi
    if [[ -n "$(group_members "$pid")" ]] && group_is_ours "$pid" "$run_id"; then
        kill -TERM -- "-$pid" 2> /dev/null
        for _ in $(seq 20); do
            [[ -z "$(group_members "$pid")" ]] && break
            sleep 0.5
        done
        kill -KILL -- "-$pid" 2> /dev/null
    fi
    rm -f "$file"
}
