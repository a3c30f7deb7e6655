#!/usr/bin/env bash
# `make demo-down`: stop everything `make demo` started, by pid and process group, never by
# name: the traffic generator first (it flushes and reports), then the archiver and the speed
# job (SIGTERM: they finish their micro-batch and stop), the API, the batch loop (a running
# batch job finishes), Prometheus, Airflow, and the broker if the demo started it (its records
# are gone). The Delta tables and logs under $RUN_DIR/demo stay; `make clean` removes them.
set -uo pipefail
cd "$(dirname "$0")/.."
source infra/demo-common.sh

# The cluster profile's services (their data stays): started before the run's own processes,
# so a demo that failed early may hold them alone.
services=0  # how many of them were recorded
stop_cluster_services() {
    if [[ -f "$DEMO/spark/master.pid" ]]; then
        services=$((services + 1))
        RUN_DIR="$DEMO" bash infra/spark-cluster.sh down | sed 's/^/demo: /'
    fi
    if [[ -f "$DEMO/postgres-run-dir" ]]; then
        services=$((services + 1))
        RUN_DIR="$(cat "$DEMO/postgres-run-dir")" bash infra/postgres.sh down 2>&1 | sed 's/^/demo: /'
        rm -f "$DEMO/postgres-run-dir"
    fi
    if [[ -f "$DEMO/s3/weed.pid" ]]; then
        services=$((services + 1))
        RUN_DIR="$DEMO" .venv/bin/ctr s3 down 2>&1 | sed 's/^/demo: /'
    fi
    return 0
}
nothing() { ((services)) && echo "nothing else" || echo "nothing"; }

run_id="$(demo_run_id)"
if [[ -z "$run_id" ]]; then
    stop_cluster_services
    say "$(nothing) to stop (no demo recorded under $DEMO)"
    exit 0
fi
anything=0
for name in "${DEMO_PROCESSES[@]}" airflow; do
    [[ -f "$DEMO/$name.pid" ]] && anything=1
done
[[ -f "$DEMO/broker-started" ]] && anything=1
if ((!anything)); then
    stop_cluster_services
    say "$(nothing) to stop (no process of demo run $run_id is recorded)"
    rm -f "$DEMO/run-id"
    exit 0
fi

# Settings of the demo (CHECKPOINT_ROOT, KAFKA_BOOTSTRAP_SERVERS, ...), written by infra/demo.sh.
[[ -f "$DEMO/env" ]] && source "$DEMO/env"

stop_component producer 30
# Let the streaming jobs read what the producer wrote last, then stop them.
drain=()
for name in archiver speed; do
    live_pid "$name" > /dev/null && drain+=("$name")
done
if ((${#drain[@]})); then
    say "waiting for ${drain[*]} to read the last records (at most 60 s)"
    .venv/bin/python -m infra.demo_drain --timeout 60 "${drain[@]}"
fi
# The two streaming jobs drain in parallel: each finishes its micro-batch and stops.
stop_component archiver 60 &
stop_component speed 60 &
wait
stop_component api 15
stop_component alerts 15
stop_component batch-loop 120
stop_component prometheus 15
stop_component pushgateway 5
stop_component node-exporter 5

if [[ -f "$DEMO/airflow.pid" ]]; then
    pid="$(cat "$DEMO/airflow.pid")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && group_is_ours "$pid" "$run_id"; then
        RUN_DIR="$DEMO" bash infra/airflow-down.sh | sed 's/^/demo: /'
    elif [[ -n "$(group_members "$pid")" ]]; then
        say "airflow: pid $pid is not a process of this demo (no CTR_DEMO_RUN=$run_id); left alone"
        rm -f "$DEMO/airflow.pid"
    else
        say "airflow: not running"
        rm -f "$DEMO/airflow.pid"
    fi
fi

# The broker watch first: it would start the nodes `ctr kafka down` stops.
stop_component broker-watch 10
if [[ -f "$DEMO/broker-started" ]]; then
    pid="$(cat "$DEMO/kafka/node-1/kafka.pid" 2> /dev/null || true)"
    if [[ "$pid" =~ ^[0-9]+$ ]] && has_marker "$pid" "$run_id"; then
        RUN_DIR="$DEMO" .venv/bin/ctr kafka down 2>&1 | sed 's/^/demo: /'
    elif [[ -n "$pid" ]] && [[ -d "/proc/$pid" ]]; then
        say "broker: pid $pid is not a process of this demo (no CTR_DEMO_RUN=$run_id); left alone"
    else
        say "broker: not running"
    fi
    rm -f "$DEMO/broker-started"
fi
# What of this run outlived its process group: Airflow runs each task in a session of its own
# (and a SIGKILLed scheduler leaves its workers), so a task running when Airflow stopped is
# still there, with its Spark driver. Found by the run's marker, never by name.
left=()
for pid in $(ps -eo pid=); do
    [[ "$pid" != "$$" ]] && has_marker "$pid" "$run_id" && left+=("$pid")
done
if ((${#left[@]})); then
    say "stopping ${#left[@]} leftover process(es) of this run (${left[*]})"
    kill -TERM "${left[@]}" 2> /dev/null
    sleep 5
    kill -KILL "${left[@]}" 2> /dev/null
fi
stop_cluster_services
rm -f "$DEMO/run-id"
say "stopped; logs and Delta tables stay under $DEMO"
