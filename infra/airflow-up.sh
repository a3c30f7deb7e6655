#!/usr/bin/env bash
# `make airflow-up`: Airflow's components as `airflow standalone` runs them (scheduler,
# dag-processor, triggerer, API server) on 127.0.0.1 with SQLite under RUN_DIR/airflow, the
# project's DAGs registered and unpaused.
#
# Another metadata database: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN (e.g. a PostgreSQL URL,
# postgresql+psycopg2://user:password@host:port/db), or AIRFLOW_DB=postgres for the private
# PostgreSQL of infra/postgres.sh (started here if it is not running, its RUN_DIR/postgres/env
# sourced). The executor is the LocalExecutor either way (AIRFLOW__CORE__EXECUTOR, Airflow's
# default).
#
# Not `airflow standalone` itself: its scheduler and triggerer each start a log server on all
# interfaces (8793 and 8794; Airflow 3.3's airflow/utils/serve_logs/core.py binds host "", and
# no setting changes that), which standalone cannot be told to leave out. Here they run with
# --skip-serve-logs: nothing listens but the API server, on 127.0.0.1. On one machine the logs
# need no server: the API server reads every task's log from the log folder the tasks write
# (while a task runs, its log view also notes "Could not read served logs").
set -euo pipefail
# Owner-only files (runtime/private.py): Airflow's database and logs, what the tasks write.
umask "${CTR_UMASK:-077}"
cd "$(dirname "$0")/.."
RUN_DIR="$(mkdir -p "${RUN_DIR:-run}" && cd "${RUN_DIR:-run}" && pwd)"
# Not listed by others; passed through (the private PostgreSQL's user: see runtime/private.py).
chmod go-rw "$RUN_DIR"
#: Airflow's home folder: airflow.cfg, its logs, its SQLite database; default RUN_DIR/airflow.
export AIRFLOW_HOME="${AIRFLOW_HOME:-$RUN_DIR/airflow}"
#: postgres: Airflow's database on the private PostgreSQL of infra/postgres.sh (started if
#: it is not running); unset or sqlite: SQLite under AIRFLOW_HOME.
case "${AIRFLOW_DB:-}" in
    "" | sqlite) ;;
    postgres)
        RUN_DIR="$RUN_DIR" bash infra/postgres.sh up
        # shellcheck source=/dev/null # written by infra/postgres.sh
        source "$RUN_DIR/postgres/env"
        ;;
    *) echo "airflow: error: AIRFLOW_DB is 'postgres' or unset (SQLite), not '$AIRFLOW_DB'" >&2; exit 1 ;;
esac
#: Airflow's executor (Airflow's own setting); default LocalExecutor: tasks as local processes.
export AIRFLOW__CORE__EXECUTOR="${AIRFLOW__CORE__EXECUTOR:-LocalExecutor}"
#: Airflow's metadata database as a SQLAlchemy URL (Airflow's own setting, e.g.
#: postgresql+psycopg2://…); unset: SQLite, or what AIRFLOW_DB=postgres sets.
if [[ -n "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-}" ]]; then
    # The URL without its password, for the log.
    database="$(sed -E 's#^([^:]+://[^:@/]*):[^@]*@#\1:***@#' <<< "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")"
else
    database="SQLite ($AIRFLOW_HOME/airflow.db)"
fi
#: The folder of the DAGs Airflow runs; default the project's dags/ (`make demo` sets its
#: generated one).
export AIRFLOW__CORE__DAGS_FOLDER="${AIRFLOW_DAGS:-$PWD/dags}"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
#: How many tasks Airflow runs at once (Airflow's own setting, its default 32). The
#: LocalExecutor forks one worker per slot (~130 MB each); ctr_batch runs one Spark job at a
#: time, and this machine has 2 cores.
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}"
export AIRFLOW__API__HOST=127.0.0.1
#: Port of Airflow's API server and web UI on 127.0.0.1; the demo stops with a message naming
#: the port if it is taken.
export AIRFLOW__API__PORT="${AIRFLOW_PORT:-8080}"
export AIRFLOW__API__BASE_URL="http://127.0.0.1:${AIRFLOW__API__PORT}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:${AIRFLOW__API__PORT}/execution/"
# Where ctr_batch's spark-submit runs: the spark_default connection (SPARK_MASTER, default
# local[2], unless AIRFLOW_CONN_SPARK_DEFAULT is set already).
spark_conn="{\"conn_type\": \"spark\", \"host\": \"${SPARK_MASTER:-local[2]}\"}"
#: Airflow's spark_default connection as JSON (Airflow's own variable), where ctr_batch's
#: spark-submit runs; default a spark connection to SPARK_MASTER (local[2]).
export AIRFLOW_CONN_SPARK_DEFAULT="${AIRFLOW_CONN_SPARK_DEFAULT:-$spark_conn}"
export LAKE_ROOT="${LAKE_ROOT:-$PWD/data/lake}" CHECKPOINT_ROOT="${CHECKPOINT_ROOT:-$PWD/data/checkpoints}"
export PATH="$PWD/.venv/bin:$PATH"  # the components' own subprocesses run `airflow …`
AIRFLOW=.venv/bin/airflow
PID_FILE="$RUN_DIR/airflow.pid"
LOG="$RUN_DIR/airflow.log"
URL="http://127.0.0.1:${AIRFLOW__API__PORT}"
START_TIMEOUT="${AIRFLOW_START_TIMEOUT:-180}"  #: Seconds until Airflow's API server must answer.
UNPAUSE="${AIRFLOW_UNPAUSE:-ctr_batch ctr_maintenance}"  #: The DAGs to unpause, space-separated.

if [[ -f "$PID_FILE" ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
    echo "airflow: already running (pid $(cat "$PID_FILE")) at $URL"
    exit 0
fi
mkdir -p "$AIRFLOW_HOME"
echo "airflow: database $database, executor $AIRFLOW__CORE__EXECUTOR"
"$AIRFLOW" db migrate > "$RUN_DIR/airflow-migrate.log" 2>&1 || {
    echo "airflow: db migrate failed, see $RUN_DIR/airflow-migrate.log" >&2; exit 1; }
# airflow.cfg itself on loopback (not only this script's AIRFLOW__API__HOST), owner-only.
.venv/bin/python -m infra.airflow_config "$AIRFLOW_HOME"
# The pool every Spark task of the project's DAGs takes a slot of (dags/definitions.py
# SPARK_POOL): one Spark driver per 2 cores, however many runs a backfill queues.
cores="$(nproc 2>/dev/null || echo 2)"
#: Slots of the ctr_spark pool: Spark drivers of the batch tasks at a time; default one per
#: 2 cores (at least 1).
SPARK_SLOTS="${AIRFLOW_SPARK_SLOTS:-$(( cores / 2 > 0 ? cores / 2 : 1 ))}"
"$AIRFLOW" pools set ctr_spark "$SPARK_SLOTS" "Spark drivers of ctr-lambda's batch tasks" \
    > /dev/null 2>> "$RUN_DIR/airflow-migrate.log" || {
    echo "airflow: could not create the ctr_spark pool, see $RUN_DIR/airflow-migrate.log" >&2; exit 1; }
echo "airflow: pool ctr_spark: $SPARK_SLOTS Spark driver(s) at a time (AIRFLOW_SPARK_SLOTS)"
# The components in one process group (airflow-down.sh signals it), their output in one log,
# each line prefixed with the component's name as standalone does. A component that exits or
# dies (a crash, SIGKILL) is started again after 5 s: this loop is Airflow's supervision in the
# demo (a task killed mid-run is the scheduler's to retry: the DAGs' retries). SIGTERM stops
# them all and waits for them.
run_components() {
    local airflow="$1" component name status exited i
    local components=("scheduler --skip-serve-logs" dag-processor "triggerer --skip-serve-logs" api-server)
    local pids=()
    trap 'kill -TERM "${pids[@]}" 2> /dev/null; wait "${pids[@]}"; exit 143' TERM INT
    launch() {  # index into components
        local component="${components[$1]}" name="${components[$1]%% *}"
        # The prefixing sed ignores SIGTERM, so it writes the component's last lines.
        # shellcheck disable=SC2086 # the component's name and flags, split on purpose
        "$airflow" $component > >(trap '' TERM; exec sed -u "s/^/$(printf '%-13s|' "$name") /") 2>&1 &
        pids[$1]=$!
    }
    for i in "${!components[@]}"; do
        launch "$i"
    done
    while true; do
        exited=""
        wait -n -p exited "${pids[@]}"
        status=$?
        [[ -z "$exited" ]] && continue
        for i in "${!pids[@]}"; do
            if [[ "${pids[$i]}" == "$exited" ]]; then
                name="${components[$i]%% *}"
                echo "airflow: $name (pid $exited) exited with status $status; starting it again in 5 s"
                [[ -n "${SUPERVISE_DIR:-}" ]] && echo "$(date +%s) airflow-$name $status" >> "$SUPERVISE_DIR/restarts.log"
                sleep 5
                launch "$i"
            fi
        done
    done
}
echo "airflow: database $database, executor $AIRFLOW__CORE__EXECUTOR" > "$LOG"
# In a session of its own, weighted as this script was started (under `nice -n N`: the
# session's CPU weight too, runtime/cpu_weight.py); its Spark tasks take SPARK_BATCH_NICE.
setsid .venv/bin/python -m runtime.cpu_weight "$(nice)" \
    bash -c "$(declare -f run_components); run_components \"\$1\"" _ "$AIRFLOW" \
    >> "$LOG" 2>&1 < /dev/null &
echo $! > "$PID_FILE"
echo -n "airflow: starting (log $LOG) "
for _ in $(seq "$START_TIMEOUT"); do
    if curl -fsS "$URL/api/v2/monitor/health" > /dev/null 2>&1; then break; fi
    if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
        echo; echo "airflow: a component exited; last log lines:" >&2; tail -20 "$LOG" >&2; exit 1
    fi
    echo -n "."; sleep 1
done
echo
curl -fsS "$URL/api/v2/monitor/health" > /dev/null || { echo "airflow: no answer at $URL after $START_TIMEOUT s (log $LOG)" >&2; exit 1; }
passwords="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
[[ -f "$passwords" ]] && chmod 600 "$passwords"  # the admin password: owner-only
# Through the API server, as soon as the DAG processor has parsed them (one request each; the
# `airflow dags` commands start Airflow's whole Python each).
if [[ -n "${UNPAUSE// /}" ]]; then
    # shellcheck disable=SC2086
    .venv/bin/python -m infra.airflow_api unpause --url "$URL" --wait "$START_TIMEOUT" $UNPAUSE \
        || echo "airflow: could not unpause $UNPAUSE (see above); unpause them in the UI" >&2
fi
password="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("admin",""))' \
    "$passwords" 2>/dev/null || true)"
echo "airflow: UI $URL  login: admin / ${password:-see $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated}"
echo "airflow: ctr_batch runs the latest complete interval now, then on its schedule" \
    "(history: airflow backfill create)"
