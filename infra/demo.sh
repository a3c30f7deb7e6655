#!/usr/bin/env bash
# `make demo`: the whole platform on this machine, in the background, then back to the prompt.
# The embedded broker and topics, the archiver, the speed job, the batch layer (Airflow's
# components as standalone runs them, without its log servers, with ctr_batch every
# DEMO_BATCH_MINUTES and ctr_recompute_stale every DEMO_STALE_MINUTES, or with DEMO_AIRFLOW=0 a
# plain loop), the API and dashboard, and generated traffic at DEMO_RATE events/s. It waits
# until each part is healthy and the dashboard has data, then prints where everything is and
# what to try.
# State (pids, logs, Delta tables, checkpoints, Airflow's SQLite) lives under $RUN_DIR/demo.
# `make demo-down` stops it all.
# PROFILE=cluster (make demo PROFILE=cluster, or make demo-cluster): the production-shaped parts
# instead of the embedded ones: 3 brokers, the lake on the local S3 server (ctr s3 up), a Spark
# standalone master and worker for the batch tasks (infra/spark-cluster.sh), Airflow with the
# LocalExecutor on PostgreSQL (infra/postgres.sh); the streaming jobs keep their own drivers.
set -uo pipefail
# Owner-only files (runtime/private.py): the lake, the broker's data, logs, tokens, Airflow.
umask "${CTR_UMASK:-077}"
cd "$(dirname "$0")/.."
ROOT="$PWD"
source infra/demo-common.sh
started_at=$(date +%s)

#: 0: a shell loop (infra/demo-batch-loop.sh) runs the batch job instead of Airflow.
DEMO_AIRFLOW="${DEMO_AIRFLOW:-1}"
#: Events per second from the traffic generator.
DEMO_RATE="${DEMO_RATE:-200}"
#: Minutes between ctr_batch runs (must divide an hour).
DEMO_BATCH_MINUTES="${DEMO_BATCH_MINUTES:-10}"
#: Minutes between ctr_recompute_stale runs (must divide an hour).
DEMO_STALE_MINUTES="${DEMO_STALE_MINUTES:-5}"
#: Minutes between ctr_maintenance runs: compaction and VACUUM of the batch tables, their
#: history window (must divide an hour).
DEMO_MAINTENANCE_MINUTES="${DEMO_MAINTENANCE_MINUTES:-60}"
#: A fresh lake starts with this much traffic history (sent at once, as the ad servers would
#: have sent it), so the batch layer has settled minutes to make exact from the start: version 3
#: covers a minute only 70 min after it (views/definitions.py Definition.settle). 0: none (none
#: either with DEMO_GROUND_TRUTH).
DEMO_HISTORY_MINUTES="${DEMO_HISTORY_MINUTES:-120}"
#: The batch layer (Airflow's Spark tasks, or the batch loop, and the history's run) runs
#: at this niceness, in sessions weighted alike (runtime/cpu_weight.py; a niceness alone holds
#: only within a session): on a few shared cores the API's answers, the speed layer's freshness
#: and a restarted streaming job come first, the batch layer's throughput after (make soak
#: CHAOS=1: restarts took 55-100 s beside a batch job; python -m bench beside-batch).
DEMO_BATCH_NICE="${DEMO_BATCH_NICE:-19}"
# What the topics may keep on disk, per partition: the archiver reads within seconds, and
# master/events is the system of record (the size bound keeps a long run's disk bounded).
# Micro-batches small enough that the streaming jobs commit within seconds of starting while
# they take a backlog in (a fresh lake's history, a restart after a pause) on a small machine:
# the archiver's default million records a batch kept its first commit, and the dashboard's
# first rows, 2-3 minutes away on 2 cores.
export ARCHIVER_MAX_OFFSETS_PER_TRIGGER="${ARCHIVER_MAX_OFFSETS_PER_TRIGGER:-100000}"
export SPEED_MAX_OFFSETS_PER_TRIGGER="${SPEED_MAX_OFFSETS_PER_TRIGGER:-50000}"
export KAFKA_TOPIC_CONFIG="${KAFKA_TOPIC_CONFIG:-{\"retention.bytes\": \"536870912\", \"segment.bytes\": \"67108864\"\}}"
#: Seconds each part of the demo may take to come up.
DEMO_START_TIMEOUT="${DEMO_START_TIMEOUT:-300}"
#: 1 or 3; default: what $DEMO/kafka holds, else 1 (PROFILE=cluster: 3). 3: three brokers and
#: a controller, topics with 3 replicas and min.insync.replicas=2.
DEMO_BROKERS="${DEMO_BROKERS:-}"
#: The broker's listener takes SASL/SCRAM logins only (ctr kafka up --auth): scram
#: (SCRAM-SHA-256), scram-sha-512, or none (no logins). Every part of the demo logs in as its
#: role, allowed what its ACLs grant: the traffic generator as the producer, the archiver and
#: the speed job (and Airflow's tasks) as the consumer, the API as the monitor; `source
#: $DEMO/env` in another shell logs in as the admin. A demo cluster from before gets its users
#: at the next start.
DEMO_KAFKA_AUTH="${DEMO_KAFKA_AUTH:-scram}"
#: 1: the listener over TLS as well (SASL_SSL, ctr kafka up --tls); 0: not; unset: as the
#: cluster is (a new one: 0).
DEMO_KAFKA_TLS="${DEMO_KAFKA_TLS:-}"
#: embedded (the default), or cluster: 3 brokers, the lake on the local S3 server, a Spark
#: standalone master and worker for the batch tasks, Airflow on PostgreSQL (make demo-cluster).
PROFILE="${PROFILE:-embedded}"
if [[ "$PROFILE" != embedded && "$PROFILE" != cluster ]]; then
    echo "demo: error: PROFILE must be embedded (the default) or cluster, got '$PROFILE'" >&2
    exit 2
fi
DEMO_SPARK_MASTER="${SPARK_MASTER:-local[2]}"  # where the batch tasks run (spark_default)
if [[ "$PROFILE" == cluster ]]; then
    DEMO_BROKERS="${DEMO_BROKERS:-3}"
    DEMO_SPARK_MASTER="spark://127.0.0.1:${SPARK_CLUSTER_PORT:-7077}"
    mkdir -p "$DEMO"
    echo "demo: [0/7] cluster profile: the S3 server and the Spark standalone cluster"
    # The lake in the local S3 server's bucket (or LAKE_ROOT=s3://… of your own store).
    if [[ -z "${LAKE_ROOT:-}" ]]; then
        RUN_DIR="$DEMO" "$PWD/.venv/bin/ctr" s3 up 2>&1 | sed 's/^/demo:       /'
        ((PIPESTATUS[0] == 0)) || { echo "demo: error: the S3 server did not start; see $DEMO/s3/weed.log" >&2; exit 1; }
        # shellcheck source=/dev/null
        source "$DEMO/s3/env"
        export LAKE_ROOT="s3://$CTR_S3_BUCKET/lake"
    fi
    # What the cluster's executors run: the project's packed environment, which every batch
    # task ships (make python-archive; nothing to do when it is up to date).
    "$PWD/.venv/bin/python" -m infra.python_archive 2>&1 | sed 's/^/demo:       /'
    ((PIPESTATUS[0] == 0)) || { echo "demo: error: make python-archive failed" >&2; exit 1; }
    RUN_DIR="$DEMO" bash infra/spark-cluster.sh up 2>&1 | sed 's/^/demo:       /'
    ((PIPESTATUS[0] == 0)) || { echo "demo: error: the Spark cluster did not start; see $DEMO/spark" >&2; bash infra/demo-down.sh; exit 1; }    # Airflow's database: PostgreSQL under RUN_DIR/postgres (its server runs as the postgres
    # user, which cannot enter the demo's own folder: that is the owner's only).
    RUN_DIR="$RUN_DIR" bash infra/postgres.sh up 2>&1 | sed 's/^/demo:       /'
    ((PIPESTATUS[0] == 0)) || { echo "demo: error: PostgreSQL did not start; see $RUN_DIR/postgres" >&2; bash infra/demo-down.sh; exit 1; }
    # shellcheck source=/dev/null
    source "$RUN_DIR/postgres/env"  # AIRFLOW__DATABASE__SQL_ALCHEMY_CONN, the LocalExecutor
    echo "$RUN_DIR" > "$DEMO/postgres-run-dir"
fi
# A scheduled run covers only settled minutes: its lookback reaches past the settle delay of the
# newest version (what a fresh lake publishes) by two periods.
SETTLE_MINUTES="$("$ROOT/.venv/bin/python" -c 'from views.definitions import NEWEST, definition
print(int(definition("ctr", NEWEST["ctr"]).settle.total_seconds() // 60))')"
#: Minutes before each scheduled interval that a batch run recomputes as well; default the
#: settle delay of the newest version (70 min) plus twice DEMO_BATCH_MINUTES.
export CTR_BATCH_LOOKBACK_MINUTES="${CTR_BATCH_LOOKBACK_MINUTES:-$((2 * DEMO_BATCH_MINUTES + SETTLE_MINUTES))}"
export LAKE_ROOT="${LAKE_ROOT:-$DEMO/lake}" CHECKPOINT_ROOT="${CHECKPOINT_ROOT:-$DEMO/checkpoints}"
#: 1: the 3 brokers in network namespaces (needs root), so ctr kafka partition can cut one off.
DEMO_NETNS="${DEMO_NETNS:-0}"
if [[ "$DEMO_NETNS" == 1 ]]; then
    DEMO_BROKERS=3
    export KAFKA_BOOTSTRAP_SERVERS="${KAFKA_BOOTSTRAP_SERVERS:-10.77.0.1:9092,10.77.0.2:9092,10.77.0.3:9092}"
elif [[ "${DEMO_BROKERS:-1}" == 3 ]]; then
    export KAFKA_BOOTSTRAP_SERVERS="${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094}"
else
    export KAFKA_BOOTSTRAP_SERVERS="${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
fi
export API_HOST=127.0.0.1 API_PORT="${API_PORT:-8000}"
#: The port of the API's PostgreSQL endpoint in the demo (psql, DBeaver, Grafana; the key is the
#: password): docs/guides/sql-clients.md.
export API_PG_PORT="${API_PG_PORT:-5433}"
export AIRFLOW_PORT="${AIRFLOW_PORT:-8080}"
#: The port of the demo's Prometheus (its UI and API), scraping every process with the rules of
#: ops/prometheus/rules (docs/guides/operations.md).
PROMETHEUS_PORT="${PROMETHEUS_PORT:-9090}"
#: The port of the Pushgateway the demo's batch runs push their figures to.
PUSHGATEWAY_PORT="${PUSHGATEWAY_PORT:-9091}"
#: The port of the node exporter reporting the broker host's disks in the demo.
NODE_EXPORTER_PORT="${NODE_EXPORTER_PORT:-9100}"
#: Seconds between two scrapes (and rule evaluations) of the demo's Prometheus.
DEMO_SCRAPE_SECONDS="${DEMO_SCRAPE_SECONDS:-15}"
# Each job's metrics on a port of its own (docs/reference/metrics.md).
export ARCHIVER_METRICS_PORT="${ARCHIVER_METRICS_PORT:-9401}" SPEED_METRICS_PORT="${SPEED_METRICS_PORT:-9402}"
export ALERTS_METRICS_PORT="${ALERTS_METRICS_PORT:-9403}"
export CTR_METRICS_PUSHGATEWAY="${CTR_METRICS_PUSHGATEWAY:-http://127.0.0.1:$PUSHGATEWAY_PORT}"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1
CTR="$ROOT/.venv/bin/ctr"
# The batch layer's processes at DEMO_BATCH_NICE, their session too (each component has one:
# start), so that on the demo's few cores the API and the streaming jobs come first
# (runtime/cpu_weight.py: between sessions the kernel shares CPU by session).
weighted=("$ROOT/.venv/bin/python" -m runtime.cpu_weight "$DEMO_BATCH_NICE")
# What the batch jobs lower themselves to (`ctr batch`, the Airflow tasks' spark-submit).
export SPARK_BATCH_NICE="${SPARK_BATCH_NICE:-$DEMO_BATCH_NICE}"
API="http://127.0.0.1:$API_PORT"
AIRFLOW_URL="http://127.0.0.1:$AIRFLOW_PORT"

fail() {  # message [log file]: say what failed and where to look, stop what was started
    echo "demo: error: $1" >&2
    if [[ -n "${2:-}" && -f "$2" ]]; then
        echo "demo: last lines of $2:" >&2
        tail -n 15 "$2" | sed 's/^/    /' >&2
    fi
    say "stopping what was started (logs stay under $DEMO)"
    bash infra/demo-down.sh
    exit 1
}

elapsed() { echo "$(($(date +%s) - started_at)) s"; }

port_in_use() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }

# Start component $1 as "$@" (after the name) in its own session and process group.
start() {
    local name="$1"
    shift
    setsid "$@" > "$DEMO/$name.log" 2>&1 < /dev/null &
    local pid=$!
    echo "$pid" > "$DEMO/$name.pid"
    sleep 0.2
    if [[ "$(ps -o pgid= -p "$pid" | tr -d ' ')" != "$pid" ]] && kill -0 "$pid" 2> /dev/null; then
        fail "$name (pid $pid) is not the leader of its own process group" "$DEMO/$name.log"
    fi
}

# Wait until the command "$@" (after name, log and what) succeeds, while component $1 stays alive.
# (Arguments are expanded once: pass a function to re-evaluate a condition.)
wait_for() {
    local name="$1" log="$2" what="$3"
    shift 3
    local deadline=$(($(date +%s) + DEMO_START_TIMEOUT))
    until "$@"; do
        if ! live_pid "$name" > /dev/null; then
            fail "$name exited before $what; see $log" "$log"
        fi
        if (($(date +%s) > deadline)); then
            fail "$name: no $what within $DEMO_START_TIMEOUT s (DEMO_START_TIMEOUT); see $log" "$log"
        fi
        sleep 2
    done
}

# Commits (files in _delta_log) of the table at $1 under LAKE_ROOT.
commits() {
    if [[ "$LAKE_ROOT" == s3://* ]]; then
        "$ROOT/.venv/bin/python" -c 'import sys
from lake.settings import LakeSettings
from lake.storage import is_delta, open_delta
store = LakeSettings().object_store
print(open_delta(sys.argv[1], store).version() + 1 if is_delta(sys.argv[1], store) else 0)' \
            "$LAKE_ROOT/$1"
    else
        compgen -G "$LAKE_ROOT/$1/_delta_log/*.json" | wc -l
    fi
}

print_summary() {
    local token
    token="$(cat "$DEMO/api-token")"
    cat << EOF

  Dashboard   $API/#token=$token
  API token   $token        (API docs: $API/docs)
  SQL         psql "host=127.0.0.1 port=$API_PG_PORT dbname=ctr user=demo" (password: the API token; docs/guides/sql-clients.md)
  Prometheus  http://127.0.0.1:$PROMETHEUS_PORT/alerts   every process scraped, the rules of ops/prometheus/rules (docs/guides/operations.md)
EOF
    if [[ -f "$DEMO/airflow.pid" ]]; then
        local password
        password="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("admin",""))' \
            "$DEMO/airflow/simple_auth_manager_passwords.json.generated" 2> /dev/null || true)"
        cat << EOF
  Airflow     $AIRFLOW_URL   login: admin / ${password:-see $DEMO/airflow/simple_auth_manager_passwords.json.generated}
              ctr_batch every $DEMO_BATCH_MINUTES min, each run with $CTR_BATCH_LOOKBACK_MINUTES min of lookback
              ctr_recompute_stale every $DEMO_STALE_MINUTES min (covered minutes that received late events)
              ctr_maintenance every $DEMO_MAINTENANCE_MINUTES min (compaction, VACUUM, Delta log cleanup)
EOF
    else
        echo "  Batch       a loop runs ctr batch every $DEMO_BATCH_MINUTES min" \
            "($CTR_BATCH_LOOKBACK_MINUTES min of lookback), then ctr batch --stale;" \
            "log $DEMO/batch-loop.log"
    fi
    cat << EOF
  Traffic     $DEMO_RATE events/s into ${KAFKA_TOPIC:-ad-events} at $KAFKA_BOOTSTRAP_SERVERS (1 % duplicates, 2 % late, 0.5 % malformed; 5 % of clicks repeated, 2 % orphan clicks)
  Kafka auth  $kafka_auth
  Logs        $DEMO/*.log   Delta tables: $LAKE_ROOT
  Profile     $PROFILE: $(echo "${KAFKA_BOOTSTRAP_SERVERS//,/ }" | wc -w) broker(s), batch tasks on $DEMO_SPARK_MASTER, Airflow's database $(if [[ -n "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-}" ]]; then echo "PostgreSQL (LocalExecutor)"; else echo SQLite; fi)
  Stop        make demo-down

The first steps (docs/getting-started.md explains each), in another shell:
EOF
    "$ROOT/.venv/bin/python" -m reference.first_steps --url "$API" --indent "  " \
        | sed "s#^  source run/demo/env#  source $DEMO/env#"
    cat << EOF

More to try here, an advertiser's key, reach and an alert firing: docs/guides/demo.md
EOF
}

# --- already running? ------------------------------------------------------------------------
mkdir -p "$DEMO"
if [[ -n "$(demo_run_id)" ]]; then
    running=()
    for name in "${DEMO_PROCESSES[@]}" airflow; do
        live_pid "$name" > /dev/null && running+=("$name")
    done
    if ((${#running[@]})); then
        say "already running (${running[*]}); make demo-down stops it"
        [[ -f "$DEMO/summary.txt" ]] && cat "$DEMO/summary.txt"
        exit 0
    fi
    say "a previous demo left state but no running process; cleaning up first"
    bash infra/demo-down.sh > /dev/null
fi

# --- checks before starting anything -----------------------------------------------------------
if ! [[ "$DEMO_BATCH_MINUTES" =~ ^[0-9]+$ ]] || ((DEMO_BATCH_MINUTES < 1 || 60 % DEMO_BATCH_MINUTES)); then
    echo "demo: error: DEMO_BATCH_MINUTES must divide an hour (1, 2, 3, 5, 10, 15, 20, 30, 60)," \
        "got '$DEMO_BATCH_MINUTES'" >&2
    exit 2
fi
if ! [[ "$DEMO_STALE_MINUTES" =~ ^[0-9]+$ ]] || ((DEMO_STALE_MINUTES < 1 || 60 % DEMO_STALE_MINUTES)); then
    echo "demo: error: DEMO_STALE_MINUTES must divide an hour (1, 2, 3, 5, 10, 15, 20, 30, 60)," \
        "got '$DEMO_STALE_MINUTES'" >&2
    exit 2
fi
if ! [[ "$DEMO_MAINTENANCE_MINUTES" =~ ^[0-9]+$ ]] || ((DEMO_MAINTENANCE_MINUTES < 1 || 60 % DEMO_MAINTENANCE_MINUTES)); then
    echo "demo: error: DEMO_MAINTENANCE_MINUTES must divide an hour (1, 2, 3, 5, 10, 15, 20, 30, 60)," \
        "got '$DEMO_MAINTENANCE_MINUTES'" >&2
    exit 2
fi
if ! [[ "$CTR_BATCH_LOOKBACK_MINUTES" =~ ^[0-9]+$ ]]; then
    echo "demo: error: CTR_BATCH_LOOKBACK_MINUTES must be a whole number of minutes," \
        "got '$CTR_BATCH_LOOKBACK_MINUTES'" >&2
    exit 2
fi
if ! [[ "$DEMO_NETNS" =~ ^[01]$ ]]; then
    echo "demo: error: DEMO_NETNS must be 0 or 1, got '$DEMO_NETNS'" >&2
    exit 2
fi
if ! [[ "${DEMO_KAFKA_AUTH,,}" =~ ^(none|scram|scram-sha-256|scram-sha-512)$ ]]; then
    echo "demo: error: DEMO_KAFKA_AUTH must be scram (the default), scram-sha-512 or none," \
        "got '$DEMO_KAFKA_AUTH'" >&2
    exit 2
fi
if ! [[ "$DEMO_KAFKA_TLS" =~ ^[01]?$ ]]; then
    echo "demo: error: DEMO_KAFKA_TLS must be 1 (SASL_SSL) or 0, got '$DEMO_KAFKA_TLS'" >&2
    exit 2
fi
if ! [[ "$DEMO_BROKERS" =~ ^[13]?$ ]]; then
    echo "demo: error: DEMO_BROKERS must be 1 or 3, got '$DEMO_BROKERS'" >&2
    exit 2
fi
if ! [[ "$DEMO_AIRFLOW" =~ ^[01]$ ]]; then
    echo "demo: error: DEMO_AIRFLOW must be 1 (Airflow) or 0 (a batch loop)," \
        "got '$DEMO_AIRFLOW'" >&2
    exit 2
fi
ports=("$API_PORT:the API (API_PORT)" "$API_PG_PORT:the API's PostgreSQL endpoint (API_PG_PORT)"
    "$PROMETHEUS_PORT:Prometheus (PROMETHEUS_PORT)" "$PUSHGATEWAY_PORT:the Pushgateway (PUSHGATEWAY_PORT)"
    "$NODE_EXPORTER_PORT:the node exporter (NODE_EXPORTER_PORT)"
    "$ARCHIVER_METRICS_PORT:the archiver's metrics (ARCHIVER_METRICS_PORT)"
    "$SPEED_METRICS_PORT:the speed job's metrics (SPEED_METRICS_PORT)"
    "$ALERTS_METRICS_PORT:the alerts runner's metrics (ALERTS_METRICS_PORT)")
if ((DEMO_AIRFLOW)); then
    # Only Airflow's API server listens: infra/airflow-up.sh runs no log servers (8793/8794).
    ports+=("$AIRFLOW_PORT:Airflow (AIRFLOW_PORT)")
fi
for entry in "${ports[@]}"; do
    if port_in_use "${entry%%:*}"; then
        echo "demo: error: port ${entry%%:*} on 127.0.0.1, needed for ${entry#*:}, is in use" \
            "(ss -ltnp 'sport = :${entry%%:*}' shows by what); stop it or choose another port" >&2
        exit 1
    fi
done

run_id="$(date -u +%Y%m%dT%H%M%SZ)-$$"
echo "$run_id" > "$DEMO/run-id"
export CTR_DEMO_RUN="$run_id"  # every process started below carries it (see demo-common.sh)
if [[ -n "${API_TOKEN:-}" ]]; then
    (umask 077 && echo "$API_TOKEN" > "$DEMO/api-token")
elif [[ ! -s "$DEMO/api-token" ]]; then
    (umask 077 && "$ROOT/.venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))' \
        > "$DEMO/api-token")
fi
export API_TOKEN="$(cat "$DEMO/api-token")"
# Prometheus scrapes the API's /metrics with a scrape-only token of its own.
mkdir -p "$DEMO/prometheus"
[[ -s "$DEMO/prometheus/metrics-token" ]] || (umask 077 && "$ROOT/.venv/bin/python" -c \
    'import secrets; print(secrets.token_urlsafe(32))' > "$DEMO/prometheus/metrics-token")
export API_METRICS_TOKEN="$(cat "$DEMO/prometheus/metrics-token")"
# The env file and the summary hold the API token and the Airflow password: owner-only from
# their first byte.
chmod 700 "$DEMO"
(umask 077 && : > "$DEMO/env")
cat > "$DEMO/env" << EOF
# source $DEMO/env: the demo's settings, for ctr and airflow commands in another shell
export PATH="$ROOT/.venv/bin:\$PATH"
export KAFKA_BOOTSTRAP_SERVERS="$KAFKA_BOOTSTRAP_SERVERS" LAKE_ROOT="$LAKE_ROOT" CHECKPOINT_ROOT="$CHECKPOINT_ROOT" KAFKA_RUN_DIR="$DEMO"
export API_TOKEN="$API_TOKEN" PYSPARK_PYTHON="$PYSPARK_PYTHON" SPARK_LOCAL_IP=127.0.0.1
export CTR_BATCH_LOOKBACK_MINUTES="$CTR_BATCH_LOOKBACK_MINUTES" CTR_METRICS_PUSHGATEWAY="$CTR_METRICS_PUSHGATEWAY"
EOF
if [[ "$LAKE_ROOT" == s3://* ]]; then
    cat >> "$DEMO/env" << EOF
export AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL:-}" AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-}" AWS_REGION="${AWS_REGION:-us-east-1}"
EOF
fi
chmod 600 "$DEMO/env"
say "starting (run $run_id, state under $DEMO)"

# --- broker and topics ---------------------------------------------------------------------------
say "[1/7] broker and topics"
RUN_DIR="$DEMO" COLUMNS=200 "$CTR" kafka up ${DEMO_BROKERS:+--brokers "$DEMO_BROKERS"} $( ((DEMO_NETNS)) && echo --netns) \
    --auth "$DEMO_KAFKA_AUTH" ${DEMO_KAFKA_TLS:+$( ((DEMO_KAFKA_TLS)) && echo --tls || echo --no-tls)} \
    2>&1 | sed 's/^/demo:       /'
((PIPESTATUS[0] == 0)) || fail "the broker did not start; see $DEMO/kafka/node-1/server.log" \
    "$DEMO/kafka/node-1/server.log"
# Each part logs in as its role, from the env file `ctr kafka up` wrote for it (owner-only):
# `"${as_producer[@]}" command…` runs the command with the producers' login; without logins the
# arrays are empty and the command runs as it is. demo.sh itself holds no login.
as_producer=() as_consumer=() as_monitor=()
kafka_auth="none (DEMO_KAFKA_AUTH=none)"
if [[ -n "${KAFKA_SASL_USERNAME:-}" ]]; then  # a cluster of yours: your login, for every part
    kafka_auth="${KAFKA_SECURITY_PROTOCOL:-?} as $KAFKA_SASL_USERNAME (your KAFKA_* settings)"
fi
if [[ "${DEMO_KAFKA_AUTH,,}" != none && -f "$DEMO/kafka/client.env" ]]; then
    with_login() { as_login=(bash -c 'source "$0" && exec "$@"' "$DEMO/kafka/$1.env"); }
    with_login producer && as_producer=("${as_login[@]}")
    with_login consumer && as_consumer=("${as_login[@]}")
    with_login monitor && as_monitor=("${as_login[@]}")
    # The admin's login (client.env) for other shells, in the env file (owner-only). Never echoed.
    admin_login="$(set -a && source "$DEMO/kafka/client.env" && {
        printf 'export KAFKA_SECURITY_PROTOCOL=%q KAFKA_SASL_MECHANISM=%q\n' \
            "$KAFKA_SECURITY_PROTOCOL" "$KAFKA_SASL_MECHANISM"
        printf 'export KAFKA_SASL_USERNAME=%q KAFKA_SASL_PASSWORD=%q\n' \
            "$KAFKA_SASL_USERNAME" "$KAFKA_SASL_PASSWORD"
        if [[ -n "${KAFKA_SSL_CA_LOCATION:-}" ]]; then
            printf 'export KAFKA_SSL_CA_LOCATION=%q\n' "$KAFKA_SSL_CA_LOCATION"
        fi
    })" || fail "cannot read $DEMO/kafka/client.env"
    login_of() { sed -n 's/.*KAFKA_SASL_USERNAME=\([^ ]*\).*/\1/p' "$DEMO/kafka/$1.env"; }
    kafka_auth="$(sed -n 's/.*KAFKA_SECURITY_PROTOCOL=\([^ ]*\).*/\1/p' "$DEMO/kafka/client.env"), a login per role, each allowed what its ACLs grant: traffic as $(login_of producer), archiver and speed job (and Airflow's --from kafka builds) as $(login_of consumer), API as $(login_of monitor), the env file (your shell) as the admin $(login_of client); each role's settings in $DEMO/kafka/<role>.env"
    {
        echo "# the broker requires SASL/SCRAM logins and authorizes each by its ACLs; this shell"
        echo "# logs in as the admin (a super user). The demo's parts log in as their roles:"
        echo "# traffic as $(login_of producer) ($DEMO/kafka/producer.env), the archiver and"
        echo "# the speed job as $(login_of consumer) (consumer.env), the API as $(login_of monitor)"
        echo "# (monitor.env): source one of those to act as that role."
        echo "$admin_login"
    } >> "$DEMO/env"
fi
broker_pid="$(cat "$DEMO/kafka/node-1/kafka.pid" 2> /dev/null || true)"
if [[ "$broker_pid" =~ ^[0-9]+$ ]] && has_marker "$broker_pid" "$run_id"; then
    # Its log lives under $DEMO/kafka: the streaming jobs go on from their checkpoints.
    touch "$DEMO/broker-started"
    # A broker node that dies is started again by the broker watch (its data and offsets stay).
    KAFKA_RUN_DIR="$DEMO" SUPERVISE_DIR="$DEMO" start broker-watch \
        bash infra/supervise.sh broker-watch "$ROOT/.venv/bin/python" -m infra.broker_watch
else
    say "      using the broker already answering at $KAFKA_BOOTSTRAP_SERVERS (demo-down leaves it)"
fi

# --- streaming jobs, API, traffic (in the background) --------------------------------------------
events_before=$(commits master/events)
speed_before=$(commits speed/ctr)
history_start=""
#: The history's traffic record count (DEMO_HISTORY_MINUTES of DEMO_RATE).
history_events=$((DEMO_HISTORY_MINUTES * 60 * DEMO_RATE))
# No history beside a ground truth (make soak): the truth counts the live producer's records.
if ((DEMO_HISTORY_MINUTES > 0 && events_before == 0)) && [[ -z "${DEMO_GROUND_TRUTH:-}" ]]; then
    history_start="$(date -u -d "-$DEMO_HISTORY_MINUTES min" +%Y-%m-%dT%H:%M:00Z)"
fi
# --- batch layer ---------------------------------------------------------------------------------
# The first scheduled run comes at the next DEMO_BATCH_MINUTES tick, for the interval ending then.
step=$((DEMO_BATCH_MINUTES * 60))
first_tick=$(($(date +%s) / step * step + step))
if ((DEMO_AIRFLOW)); then
    say "[2/7] Airflow at $AIRFLOW_URL starting in the background (log $DEMO/airflow-up.log)"
    if ((DEMO_BATCH_MINUTES == 60)); then
        schedule="0 * * * *"
    else
        schedule="*/$DEMO_BATCH_MINUTES * * * *"
    fi
    # The DAGs are code, not environment: the demo's schedule is a DAG file of its own, the
    # project's definitions called with the demo's schedule, lookback and start (the previous
    # tick, with catch-up: the first run comes at the next tick; after a history, without: the
    # history's run covered the ticks before ctr_batch is unpaused, and its first run is the
    # latest interval's).
    mkdir -p "$DEMO/dags"
    cron_every() { if (($1 == 60)); then echo "0 * * * *"; else echo "*/$1 * * * *"; fi; }
    stale_schedule="$(cron_every "$DEMO_STALE_MINUTES")"
    maintenance_schedule="$(cron_every "$DEMO_MAINTENANCE_MINUTES")"
    cat > "$DEMO/dags/ctr_demo.py" << EOF
"""The Airflow DAGs of \`make demo\`, generated by infra/demo.sh: ctr_batch every
$DEMO_BATCH_MINUTES min, each run with $CTR_BATCH_LOOKBACK_MINUTES min of lookback;
ctr_recompute_stale every $DEMO_STALE_MINUTES min; ctr_maintenance every $DEMO_MAINTENANCE_MINUTES min;
ctr_reprocess as in dags/."""

from datetime import datetime

from dags.definitions import (
    ctr_batch_dag,
    ctr_maintenance_dag,
    ctr_recompute_stale_dag,
    ctr_reprocess_dag,
)

ctr_batch = ctr_batch_dag(
    schedule="$schedule",
    lookback_minutes=$CTR_BATCH_LOOKBACK_MINUTES,
    start_date=datetime.fromisoformat("$(date -u -d "@$((first_tick - step))" +%Y-%m-%dT%H:%M:00+00:00)"),
    catchup=$([[ -n "$history_start" ]] && echo False || echo True),
)
ctr_recompute_stale = ctr_recompute_stale_dag(schedule="$stale_schedule")
ctr_reprocess = ctr_reprocess_dag()
ctr_maintenance = ctr_maintenance_dag(schedule="$maintenance_schedule")
EOF
    # ctr_batch's spark-submit runs on the spark_default connection's master.
    spark_conn='{"conn_type": "spark", "host": "'"$DEMO_SPARK_MASTER"'"}'
    export AIRFLOW_CONN_SPARK_DEFAULT="${AIRFLOW_CONN_SPARK_DEFAULT:-$spark_conn}"
    export AIRFLOW_DAGS="$DEMO/dags" AIRFLOW_START_TIMEOUT="$DEMO_START_TIMEOUT"
    # Beside everything else (its database migration and its components' start are a minute of
    # Python): the demo waits for it at [7/7]. With a history, ctr_batch stays paused until the
    # history's own batch run is done (infra/demo-history.sh), so the two do not recompute the
    # same minutes side by side. Its tasks read Kafka only to build a view from the log
    # (ctr_reprocess --from kafka). Its own components at the usual weight (at the lowest, they
    # took 280 s to start beside the streaming jobs taking in the history); its Spark tasks run
    # at SPARK_BATCH_NICE, in sessions of their own (dags/definitions.py).
    unpause="ctr_recompute_stale ctr_maintenance"
    [[ -n "$history_start" ]] || unpause="ctr_batch $unpause"
    AIRFLOW_UNPAUSE="$unpause" RUN_DIR="$DEMO" "${as_consumer[@]}" \
        bash infra/airflow-up.sh > "$DEMO/airflow-up.log" 2>&1 &
    airflow_up=$!
else
    say "[2/7] batch loop (DEMO_AIRFLOW=0): ctr batch every $DEMO_BATCH_MINUTES min"
fi

say "[3/7] archiver, speed job, API, alerts runner, Prometheus and traffic generator starting in the background"
# Each under infra/supervise.sh: started again when it dies (SUPERVISE_DIR: its child's pid
# and a line per restart in restarts.log).
export SUPERVISE_DIR="$DEMO"
supervised() { start "$1" bash infra/supervise.sh "$@"; }
supervised archiver "${as_consumer[@]}" "$CTR" archive
supervised speed "${as_consumer[@]}" "$CTR" speed
supervised api "${as_monitor[@]}" "$CTR" serve --host 127.0.0.1 --port "$API_PORT"
# Two example alert rules (kept across restarts: the lake holds them), evaluated each minute:
# each ad's CTR of the biggest campaign over the last 5 minutes (short: a broken ad shows in
# minutes; its ads are big enough to test on 5), and the clicks of every row over 15, each
# against the hour before (a fresh lake has no week of history for a same-time-of-day baseline).
if ! "$CTR" alerts list 2>&1 | grep -q "ad-ctr"; then
    "$CTR" alerts create ad-ctr --where campaign_id=cmp-001 --per ad_id --window 5 \
        --baseline previous --baseline-minutes 60 --min-effect 0.3 \
        > /dev/null 2>> "$DEMO/alerts.log"
    "$CTR" alerts create all-clicks --measure clicks --baseline previous --baseline-minutes 60 \
        --min-effect 0.3 > /dev/null 2>> "$DEMO/alerts.log"
fi
supervised alerts "$CTR" alerts run
# Prometheus (Debian's, fetched once into the binary cache), its Pushgateway and node exporter.
prometheus_bin="$(bash infra/prometheus.sh)" || fail "Prometheus could not be fetched (infra/prometheus.sh)"
start pushgateway "$prometheus_bin/prometheus-pushgateway" --web.listen-address="127.0.0.1:$PUSHGATEWAY_PORT" \
    --persistence.file="$DEMO/prometheus/pushgateway.data"
start node-exporter "$prometheus_bin/prometheus-node-exporter" --web.listen-address="127.0.0.1:$NODE_EXPORTER_PORT" \
    --collector.disable-defaults --collector.filesystem
"$ROOT/.venv/bin/python" -m infra.prometheus_config --out "$DEMO/prometheus/prometheus.yml" \
    --interval "$DEMO_SCRAPE_SECONDS" --api "127.0.0.1:$API_PORT" \
    --api-token-file "$DEMO/prometheus/metrics-token" --archiver "127.0.0.1:$ARCHIVER_METRICS_PORT" \
    --speed "127.0.0.1:$SPEED_METRICS_PORT" --alerts "127.0.0.1:$ALERTS_METRICS_PORT" \
    --pushgateway "127.0.0.1:$PUSHGATEWAY_PORT" --broker-host "127.0.0.1:$NODE_EXPORTER_PORT"
start prometheus "$prometheus_bin/prometheus" --config.file="$DEMO/prometheus/prometheus.yml" \
    --storage.tsdb.path="$DEMO/prometheus/data" --storage.tsdb.retention.time=7d \
    --web.listen-address="127.0.0.1:$PROMETHEUS_PORT"
traffic=(--duplicates 0.01 --late 0.02 --malformed 0.005 --repeat-clicks 0.05 --orphan-clicks 0.02)
producer_args=(--rate "$DEMO_RATE" "${traffic[@]}")
#: A CSV path: the traffic generator writes the exact counts of every record it delivered
#: there when it stops (make soak compares the batch view with it); unset: none.
[[ -n "${DEMO_GROUND_TRUTH:-}" ]] && producer_args+=(--ground-truth "$DEMO_GROUND_TRUTH")
# With a history, the stream's clock starts at its beginning: the history is the backlog the
# generator sends at once, then it keeps DEMO_RATE, one stream without a seam (a restart after a
# crash goes on from now: infra/demo-producer.sh).
rm -f "$DEMO/history-started"
supervised producer env HISTORY_START="$history_start" DEMO="$DEMO" "${as_producer[@]}" \
    bash infra/demo-producer.sh "$CTR" produce "${producer_args[@]}"
if [[ -n "$history_start" ]]; then
    # Its settled minutes made exact by one batch run once archived (infra/demo-history.sh).
    start history "${weighted[@]}" env HISTORY_START="$history_start" HISTORY_END="$(date -u +%Y-%m-%dT%H:%M:00Z)" \
        UNPAUSE_AFTER="$( ((DEMO_AIRFLOW)) && echo ctr_batch)" \
        AIRFLOW_HOME="$DEMO/airflow" bash infra/demo-history.sh
    say "      history: the last $DEMO_HISTORY_MINUTES min of traffic ($history_events records), the generator's backlog; one ctr batch makes it exact once archived ($DEMO/history.log)"
fi
if ((!DEMO_AIRFLOW)); then
    start batch-loop "${weighted[@]}" bash infra/supervise.sh batch-loop bash infra/demo-batch-loop.sh
fi

say "[4/7] API at $API"
wait_for api "$DEMO/api.log" "answer on $API/healthz" curl -fs -o /dev/null "$API/healthz"
say "      healthy ($(elapsed))"

# --- streams healthy, data visible ---------------------------------------------------------------
live_pid producer > /dev/null || fail "the traffic generator exited; see $DEMO/producer.log" "$DEMO/producer.log"
say "[5/7] archiver: waiting for its first commit to master/events"
archived() { (($(commits master/events) > events_before)); }
wait_for archiver "$DEMO/archiver.log" "commit to master/events" archived
say "      archiving ($(elapsed))"
say "[6/7] speed job: waiting for its first commit to speed/ctr"
streamed() { (($(commits speed/ctr) > speed_before)); }
wait_for speed "$DEMO/speed.log" "commit to speed/ctr" streamed
say "      streaming ($(elapsed))"
if ((DEMO_AIRFLOW)); then
    say "[7/7] Airflow: waiting for it to answer at $AIRFLOW_URL"
    wait "$airflow_up"
    airflow_status=$?
    sed 's/^/demo:       /' "$DEMO/airflow-up.log"
    ((airflow_status == 0)) || fail "Airflow did not start; see $DEMO/airflow.log" "$DEMO/airflow.log"
    live_pid airflow > /dev/null || fail "Airflow is not running; see $DEMO/airflow.log" "$DEMO/airflow.log"
    if [[ -n "$history_start" ]]; then
        say "      healthy; ctr_recompute_stale unpaused, ctr_batch once the history's batch run is done ($(elapsed))"
    else
        say "      healthy; ctr_batch and ctr_recompute_stale unpaused ($(elapsed))"
        say "      first batch run at $(date -u -d "@$first_tick" +%H:%M) UTC, then every $DEMO_BATCH_MINUTES min"
    fi
fi
say "      dashboard: waiting for the API to serve rows"
has_rows() {
    curl -fsS -H "Authorization: Bearer $API_TOKEN" "$API/api/v1/ctr?granularity=hour" 2> /dev/null \
        | "$ROOT/.venv/bin/python" -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["rows"] else 1)'
}
wait_for api "$DEMO/api.log" "rows from /api/v1/ctr" has_rows
live_pid producer > /dev/null || fail "the traffic generator exited; see $DEMO/producer.log" "$DEMO/producer.log"

if ((DEMO_AIRFLOW)); then
    cat >> "$DEMO/env" << EOF
export AIRFLOW_HOME="$DEMO/airflow" AIRFLOW__CORE__DAGS_FOLDER="$DEMO/dags" AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_CONN_SPARK_DEFAULT='$AIRFLOW_CONN_SPARK_DEFAULT'
EOF
fi
(umask 077 && print_summary > "$DEMO/summary.txt")
say "up in $(elapsed)"
cat "$DEMO/summary.txt"
