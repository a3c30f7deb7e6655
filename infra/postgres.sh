#!/usr/bin/env bash
# `make postgres-up` / `make postgres-down`: a private PostgreSQL cluster for Airflow's metadata
# database, under RUN_DIR/postgres (data/, sockets/, postgres.log), listening on 127.0.0.1 only,
# port PG_PORT (55432).
#
#   infra/postgres.sh up      create the cluster on first use (initdb), start it, create the role
#                             and database `airflow`, write RUN_DIR/postgres/env; already up: says so
#   infra/postgres.sh down    stop it (fast shutdown); the data stays for the next `up`
#   infra/postgres.sh status  running or not (exit 3 when not, as pg_ctl)
#
# The server is Debian's (package `postgresql`, installed when missing; 15 on Debian 12, PG_BIN to
# choose other binaries). `airflow` logs in with a password over TCP from 127.0.0.1 only
# (scram-sha-256); the password is generated once into RUN_DIR/postgres/password (mode 600) and
# `source RUN_DIR/postgres/env` (mode 600) sets AIRFLOW__DATABASE__SQL_ALCHEMY_CONN and
# AIRFLOW__CORE__EXECUTOR=LocalExecutor. The socket directory is owner-only: the one local login
# is the cluster owner's (peer authentication), which this script uses to create the role.
#
# PostgreSQL refuses to run as root. As root (this machine, CI), the server and its tools run as
# the `postgres` OS user, which owns data/ and sockets/: RUN_DIR must be reachable by it (no
# private parent directory on the way, such as a mode-700 home or pytest's temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="$(mkdir -p "${RUN_DIR:-run}" && cd "${RUN_DIR:-run}" && pwd)"
#: Port of the private PostgreSQL on 127.0.0.1.
PG_PORT="${PG_PORT:-55432}"
DIR="$RUN_DIR/postgres"
DATA="$DIR/data"
SOCKETS="$DIR/sockets"
LOG="$DIR/postgres.log"
PASSWORD_FILE="$DIR/password"
ENV_FILE="$DIR/env"
OWNER="$(id -un)"
[[ "$(id -u)" == 0 ]] && OWNER=postgres

usage() {
    echo "usage: $0 up|down|status" >&2
    exit 2
}

# The server's binaries: PG_BIN, else those of the version the data directory was made with,
# else the newest installed (installing Debian's `postgresql` if there are none).
find_binaries() {
    #: Folder of the PostgreSQL binaries to run (initdb, pg_ctl, postgres); unset: those of the
    #: data directory's version, else the newest installed.
    [[ -n "${PG_BIN:-}" ]] && return
    if [[ -f "$DATA/PG_VERSION" && -x "/usr/lib/postgresql/$(cat "$DATA/PG_VERSION")/bin/initdb" ]]; then
        PG_BIN="/usr/lib/postgresql/$(cat "$DATA/PG_VERSION")/bin"
        return
    fi
    if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null; then
        bash infra/system-packages.sh postgresql
    fi
    PG_BIN="$(find /usr/lib/postgresql -path '*/bin/initdb' 2>/dev/null | sort -V | tail -1)"
    PG_BIN="${PG_BIN%/initdb}"
    [[ -n "$PG_BIN" ]] || {
        echo "postgres: error: no PostgreSQL server binaries (/usr/lib/postgresql/*/bin)" >&2
        exit 1
    }
}

# A command as the cluster's owner, from / (the owner may not reach the current directory).
as_owner() {
    if [[ "$(id -u)" == 0 ]]; then
        (cd / && runuser -u "$OWNER" -- "$@")
    else
        "$@"
    fi
}

running_pid() {  # the postmaster's pid when the cluster runs, else nothing (and status 1)
    [[ -f "$DATA/postmaster.pid" ]] || return 1
    as_owner "$PG_BIN/pg_ctl" status -D "$DATA" > /dev/null 2>&1 || return 1
    head -1 "$DATA/postmaster.pid"
}

running_port() {  # the port of the running cluster (line 4 of postmaster.pid)
    sed -n 4p "$DATA/postmaster.pid"
}

prepare_dirs() {
    if [[ "$(id -u)" == 0 ]] && ! id -u "$OWNER" > /dev/null 2>&1; then
        useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$OWNER"
    fi
    mkdir -p "$DIR" "$DATA" "$SOCKETS"
    # Run as root, the server's user passes through RUN_DIR (owner-only under CTR_UMASK): the
    # right to pass, not to list it (runtime/private.py keeps it).
    [[ "$OWNER" != "$(id -un)" ]] && chmod o+x "$RUN_DIR"
    chmod 755 "$DIR"
    touch "$LOG"
    chown "$OWNER" "$DATA" "$SOCKETS" "$LOG"
    chmod 700 "$DATA" "$SOCKETS"
    chmod 600 "$LOG"
    if ! as_owner test -w "$DATA"; then
        echo "postgres: error: the '$OWNER' user cannot reach $DATA: a parent directory is" \
            "closed to it; use a RUN_DIR under directories every user may enter" >&2
        exit 1
    fi
    # A Unix socket's path has at most 107 bytes.
    if ((${#SOCKETS} + ${#PG_PORT} + 10 > 107)); then
        echo "postgres: error: $SOCKETS is too long for a Unix socket path; use a shorter RUN_DIR" >&2
        exit 1
    fi
}

init_cluster() {
    [[ -f "$DATA/PG_VERSION" ]] && return
    echo "postgres: creating the cluster in $DATA"
    as_owner "$PG_BIN/initdb" -D "$DATA" --encoding=UTF8 --locale=C --auth-local=peer \
        --auth-host=scram-sha-256 --no-instructions > "$DIR/initdb.log" 2>&1 || {
        echo "postgres: error: initdb failed, see $DIR/initdb.log" >&2
        exit 1
    }
    # Local logins: the owner only, by its OS user (the socket directory is the owner's anyway).
    # TCP: airflow, to its database, from 127.0.0.1, with its password.
    cat > "$DATA/pg_hba.conf" <<'EOF'
# Written by infra/postgres.sh.
# TYPE  DATABASE  USER     ADDRESS        METHOD
local   all       all                     peer
host    airflow   airflow  127.0.0.1/32   scram-sha-256
EOF
    echo "include_if_exists = 'ctr-lambda.conf'" >> "$DATA/postgresql.conf"
    chown "$OWNER" "$DATA/pg_hba.conf"
    chmod 600 "$DATA/pg_hba.conf"
}

# Where it listens, written at each start (PG_PORT may differ from the last one).
write_settings() {
    cat > "$DATA/ctr-lambda.conf" <<EOF
# Written by infra/postgres.sh at each start.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '${SOCKETS//\'/\'\'}'
unix_socket_permissions = 0700
password_encryption = scram-sha-256
EOF
    chown "$OWNER" "$DATA/ctr-lambda.conf"
    chmod 600 "$DATA/ctr-lambda.conf"
}

password() {  # the airflow role's password, generated on first use (hex: no quoting anywhere)
    if [[ ! -s "$PASSWORD_FILE" ]]; then
        (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$PASSWORD_FILE")
    fi
    chmod 600 "$PASSWORD_FILE"
    cat "$PASSWORD_FILE"
}

# The role and database `airflow` (the role's password set to the file's at every `up`), over the
# owner's socket; the statements on standard input, not on a command line.
ensure_airflow_database() {
    local port="$1" pw="$2"
    as_owner "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCKETS" -p "$port" -d postgres <<EOF
SELECT 'CREATE ROLE airflow' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'airflow')\gexec
ALTER ROLE airflow WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '$pw';
SELECT 'CREATE DATABASE airflow OWNER airflow' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'airflow')\gexec
EOF
}

write_env() {
    local port="$1" pw="$2"
    (umask 077 && cat > "$ENV_FILE" <<EOF
# Airflow's metadata database: the private PostgreSQL of infra/postgres.sh (source this file).
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg2://airflow:$pw@127.0.0.1:$port/airflow
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
EOF
    )
    chmod 600 "$ENV_FILE"
}

up() {
    local pid port pw
    find_binaries
    prepare_dirs
    if pid="$(running_pid)"; then
        port="$(running_port)"
        echo "postgres: already running (pid $pid) on 127.0.0.1:$port, data $DATA"
    else
        init_cluster
        write_settings
        as_owner "$PG_BIN/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 60 -s || {
            echo "postgres: error: the server did not start; last lines of $LOG:" >&2
            tail -20 "$LOG" >&2
            exit 1
        }
        pid="$(running_pid)"
        port="$(running_port)"
        echo "postgres: started (pid $pid) on 127.0.0.1:$port, data $DATA, log $LOG"
    fi
    pw="$(password)"
    ensure_airflow_database "$port" "$pw"
    write_env "$port" "$pw"
    echo "postgres: database airflow, user airflow; settings for Airflow: source $ENV_FILE"
}

down() {
    local pid
    [[ -f "$DATA/postmaster.pid" ]] && find_binaries
    if ! pid="$(running_pid)"; then
        echo "postgres: not running"
        return
    fi
    as_owner "$PG_BIN/pg_ctl" stop -D "$DATA" -m fast -w -t 60 -s
    echo "postgres: stopped (pid $pid); the data stays in $DATA"
}

status() {
    local pid
    [[ -f "$DATA/postmaster.pid" ]] && find_binaries
    if ! pid="$(running_pid)"; then
        echo "postgres: not running (data ${DATA})"
        exit 3
    fi
    echo "postgres: running (pid $pid) on 127.0.0.1:$(running_port), data $DATA, log $LOG"
}

(($# == 1)) || usage
case "$1" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) usage ;;
esac
