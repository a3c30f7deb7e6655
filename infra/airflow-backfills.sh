#!/usr/bin/env bash
# The backfills of the running Airflow (infra/airflow-up.sh, make demo): list, pause, unpause or
# cancel them through Airflow's REST API, or create one with Airflow's CLI once its DAG is known
# to exist. Cancelling stops new runs of the backfill from starting; runs already running finish.
# Airflow marks its queued runs failed: each gets the note 'never ran: backfill N was cancelled'.
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
token="$(cd "$here/.." && python3 -m infra.airflow_api token --url "$URL")"
body="$(mktemp)"
trap 'rm -f "$body"' EXIT
call() {  # METHOD PATH [JSON]: the answer's body into $body, its HTTP status on stdout
    local data=()
    [[ -z "${3:-}" ]] || data=(-H "Content-Type: application/json" --data "$3")
    curl -sS -o "$body" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $token" \
        "${data[@]}" "$URL/api/v2$2" || fail "Airflow's API at $URL did not answer"
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
note_cancelled() {  # BACKFILL_ID, its cancel's answer in $body: a note on each run that never ran
    # Airflow's cancel turns the backfill's queued runs to failed, shown as failures in its UI. The
    # REST API gives a run no backfill_id: the backfill's runs are its DAG's backfill runs changed
    # since it was created (a DAG has one backfill running at a time); the failed ones without a
    # start_date never ran. A run that has a note keeps it.
    local id="$1" dag since status offset=0 noted=0 run answer page=() runs=()
    local note="never ran: backfill $id was cancelled (Airflow marks its queued runs failed)"
    answer="$(python3 -c 'import json, sys, urllib.parse
b = json.load(open(sys.argv[1]))
print(*(urllib.parse.quote(b[k], safe="") for k in ("dag_id", "created_at")))' "$body")"
    dag="${answer% *}"
    since="${answer#* }"
    local runs_of="/dags/$dag/dagRuns?run_type=backfill&state=failed&updated_at_gte=$since"
    while :; do
        status="$(call GET "$runs_of&order_by=id&limit=100&offset=$offset")"
        [[ "$status" == 200 ]] || fail "backfill $id: cancelled; its runs: HTTP $status: $(detail)"
        # The page's length, whether more follow, then the ids (quoted for a path) of those to note.
        answer="$(python3 -c 'import json, sys, urllib.parse
found, offset = json.load(open(sys.argv[1])), int(sys.argv[2])
runs = found["dag_runs"]
print(len(runs))
print("more" if runs and offset + len(runs) < (found.get("total_entries") or 0) else "last")
for r in runs:
    if r["state"] == "failed" and r["start_date"] is None and not r["note"]:
        print(urllib.parse.quote(r["dag_run_id"], safe=""))' "$body" "$offset")"
        mapfile -t page <<< "$answer"
        runs+=("${page[@]:2}")
        [[ "${page[1]}" == more ]] || break
        offset=$((offset + page[0]))
    done
    for run in "${runs[@]}"; do
        status="$(call PATCH "/dags/$dag/dagRuns/$run?update_mask=note" "{\"note\": \"$note\"}")"
        [[ "$status" == 200 ]] || fail "backfill $id: cancelled; run $run: HTTP $status: $(detail)"
        noted=$((noted + 1))
    done
    echo "backfill $id: $noted run(s) that never ran noted '$note'"
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
        if [[ "$action" == cancel ]]; then
            note_cancelled "$1"
        fi
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
