#!/usr/bin/env bash
# A Spark standalone cluster on this machine, from the pyspark distribution in .venv: a master
# on 127.0.0.1:${SPARK_CLUSTER_PORT:-7077} and one worker (SPARK_WORKER_CORES, default 2;
# SPARK_WORKER_MEMORY, default 2g), state and logs under RUN_DIR/spark.
#   bash infra/spark-cluster.sh up|down|status
# Jobs reach it with SPARK_MASTER=spark://127.0.0.1:7077 (Airflow: the spark_default connection).
# Any standalone, YARN or Kubernetes cluster does the same by configuration (docs/guides/deployment.md).
set -euo pipefail
# Owner-only files (runtime/private.py): what the master, the worker and the executors write.
umask "${CTR_UMASK:-077}"
cd "$(dirname "$0")/.."
ROOT="$PWD"
RUN_DIR="$(mkdir -p "${RUN_DIR:-run}" && cd "${RUN_DIR:-run}" && pwd)"
DIR="$RUN_DIR/spark"
#: Port of the Spark master on 127.0.0.1 (jobs reach it at spark://127.0.0.1:PORT).
PORT="${SPARK_CLUSTER_PORT:-7077}"
URL="spark://127.0.0.1:$PORT"
#: Port of the master's web UI on 127.0.0.1.
UI_PORT="${SPARK_CLUSTER_UI_PORT:-8090}"
#: Memory the worker offers its executors, as Spark writes it (2g, 512m).
WORKER_MEMORY="${SPARK_WORKER_MEMORY:-2g}"
#: Port of the worker's web UI on 127.0.0.1.
WORKER_UI_PORT="${SPARK_WORKER_UI_PORT:-8091}"
BIN="$ROOT/.venv/bin"

alive() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2> /dev/null; }

up() {
    if alive master && alive worker; then
        echo "spark: already running at $URL"
        return 0
    fi
    down > /dev/null
    mkdir -p "$DIR/work"
    export PYSPARK_PYTHON="$BIN/python" SPARK_LOCAL_IP=127.0.0.1 SPARK_NO_DAEMONIZE=1
    # Finished applications' folders (their logs and fetched files) go after a day.
    export SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.appDataTtl=86400"
    setsid "$BIN/spark-class" org.apache.spark.deploy.master.Master --host 127.0.0.1 \
        --port "$PORT" --webui-port "$UI_PORT" > "$DIR/master.log" 2>&1 &
    echo $! > "$DIR/master.pid"
    setsid "$BIN/spark-class" org.apache.spark.deploy.worker.Worker "$URL" --host 127.0.0.1 \
        --cores "${SPARK_WORKER_CORES:-2}" --memory "$WORKER_MEMORY" \
        --webui-port "$WORKER_UI_PORT" --work-dir "$DIR/work" > "$DIR/worker.log" 2>&1 &
    echo $! > "$DIR/worker.pid"
    for _ in $(seq 1 120); do
        if grep -q "Registering worker" "$DIR/master.log" 2> /dev/null; then
            #: Cores the worker offers its executors.
            echo "spark: master $URL and a worker (${SPARK_WORKER_CORES:-2} cores) up; logs in $DIR"
            return 0
        fi
        alive master && alive worker || break
        sleep 0.5
    done
    echo "spark: error: the worker did not register; see $DIR/master.log and $DIR/worker.log" >&2
    down > /dev/null
    return 1
}

down() {
    local name pid stopped=0
    for name in worker master; do
        if alive "$name"; then
            pid="$(cat "$DIR/$name.pid")"
            kill -TERM -- "-$pid" 2> /dev/null || kill -TERM "$pid"
            for _ in $(seq 1 60); do kill -0 "$pid" 2> /dev/null || break; sleep 0.5; done
            kill -KILL -- "-$pid" 2> /dev/null || true
            stopped=1
        fi
        rm -f "$DIR/$name.pid"
    done
    if ((stopped)); then echo "spark: stopped"; else echo "spark: was not running"; fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) if alive master && alive worker; then echo "spark: running at $URL"; else echo "spark: not running"; exit 3; fi ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
