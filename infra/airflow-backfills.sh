#!/usr/bin/env bash
# The backfills of the running Airflow (infra/airflow-up.sh, make demo): list, pause, unpause or
# cancel them through Airflow's REST API, or create one with Airflow's CLI once its DAG is known
# to exist. Cancelling stops new runs of the backfill from starting; runs already running finish.
#   bash infra/airflow-backfills.sh list [DAG_ID]      (default ctr_batch; --dag-id DAG_ID too)
#   bash infra/airflow-backfills.sh cancel|pause|unpause BACKFILL_ID
#   bash infra/airflow-backfills.sh create --dag-id DAG_ID --from-date ... --to-date ... [...]
#       (the options of `airflow backfill create`, run by .venv/bin/airflow)
# Reads AIRFLOW_HOME (source run/demo/env) for the admin password, AIRFLOW_PORT (default 8080).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
usage() {  # the comment above, then exit 2
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" >&2
    exit 2
}
fail() { echo "airflow-backfills: $*" >&2; exit 1; }

# The arguments are checked before Airflow is asked anything.
(($# >= 1)) || usage
action="$1"
shift
dag=""
case "$action" in
    list)
        if [[ "${1:-}" == "--dag-id" ]]; then
            (($# == 2)) || usage
            dag="$2"
        else
            (($# <= 1)) || usage
            dag="${1:-ctr_batch}"
        fi
        ;;
    cancel | pause | unpause)
        (($# == 1)) || usage
        [[ "$1" =~ ^[0-9]+$ ]] || fail "BACKFILL_ID: a number, got '$1' (list them: bash $0 list)"
        ;;
    create)
        args=("$@")
        for ((i = 0; i < ${#args[@]}; i++)); do
            case "${args[i]}" in
                --dag-id | -d) dag="${args[i + 1]:-}" ;;
                --dag-id=*) dag="${args[i]#--dag-id=}" ;;
            esac
        done
        [[ -n "$dag" ]] || fail "create: --dag-id DAG_ID is required"
        ;;
    *)
        echo "airflow-backfills: unknown action '$action'" >&2
        usage
        ;;
esac
if [[ -n "$dag" && ! "$dag" =~ ^[A-Za-z0-9_.-]+$ ]]; then
    fail "DAG_ID: letters, digits, '_', '.' and '-', got '$dag'"
fi

URL="http://127.0.0.1:${AIRFLOW_PORT:-8080}"
passwords="${AIRFLOW_HOME:?set AIRFLOW_HOME (source run/demo/env)}/simple_auth_manager_passwords.json.generated"
[[ -r "$passwords" ]] || fail "no password file at $passwords"
token="$(python3 - "$URL" "$passwords" << 'PY'
import json, sys, urllib.request
url, passwords = sys.argv[1], sys.argv[2]
body = json.dumps({"username": "admin", "password": json.load(open(passwords))["admin"]}).encode()
request = urllib.request.Request(f"{url}/auth/token", body, {"Content-Type": "application/json"})
try:
    print(json.load(urllib.request.urlopen(request, timeout=30))["access_token"])
except OSError as exc:
    sys.exit(f"airflow-backfills: cannot log in to Airflow at {url} ({exc}): is it running?")
PY
)"
body="$(mktemp)"
trap 'rm -f "$body"' EXIT
call() {  # METHOD PATH: the answer's body into $body, its HTTP status on stdout
    curl -sS -o "$body" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $token" \
        "$URL/api/v2$2" || fail "Airflow's API at $URL did not answer"
}
detail() {  # what Airflow said of a refusal
    python3 -c 'import json, sys
try:
    print(json.load(open(sys.argv[1])).get("detail"))
except ValueError:
    print(open(sys.argv[1]).read().strip()[:300])' "$body"
}
check_dag() {  # DAG_ID: fail, naming the DAGs there are, unless Airflow has it
    local status
    status="$(call GET "/dags/$1")"
    [[ "$status" == 200 ]] && return
    [[ "$status" == 404 ]] || fail "DAG $1: HTTP $status from Airflow: $(detail)"
    status="$(call GET "/dags?limit=100&order_by=dag_id")"
    local known
    known="$(python3 -c 'import json, sys
print(", ".join(d["dag_id"] for d in json.load(open(sys.argv[1]))["dags"]))' "$body")"
    fail "no DAG '$1' in this Airflow; its DAGs: ${known:-none}"
}

case "$action" in
    list)
        check_dag "$dag"
        status="$(call GET "/backfills?dag_id=$dag&limit=100")"
        [[ "$status" == 200 ]] || fail "list: HTTP $status from Airflow: $(detail)"
        python3 -c '
import json, sys
found = json.load(open(sys.argv[1]))["backfills"]
print(len(found), "backfill(s) of", sys.argv[2])
for b in found:
    state = "cancelled/done" if b["completed_at"] else ("paused" if b["is_paused"] else "running")
    print("  id {id}: {dag_id} {from_date} .. {to_date}, max_active_runs {max_active_runs}, ".format(**b) + state)' "$body" "$dag"
        ;;
    cancel | pause | unpause)
        status="$(call PUT "/backfills/$1/$action")"
        case "$status" in
            2??) echo "backfill $1: $action requested" ;;
            404) fail "no backfill $1 (list them: bash $0 list [DAG_ID])" ;;
            *) fail "backfill $1: $action refused, HTTP $status: $(detail)" ;;
        esac
        ;;
    create)
        check_dag "$dag"
        airflow="$here/../.venv/bin/airflow"
        [[ -x "$airflow" ]] || airflow="airflow"
        rm -f "$body"
        trap - EXIT
        exec "$airflow" backfill create "$@"
        ;;
esac
