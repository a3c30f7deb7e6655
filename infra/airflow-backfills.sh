#!/usr/bin/env bash
# The backfills of the running Airflow (infra/airflow-up.sh, make demo): list, pause, unpause or
# cancel them through Airflow's REST API (its CLI can only create one). Cancelling stops new runs
# of the backfill from starting; runs already running finish.
#   bash infra/airflow-backfills.sh list [DAG_ID]      (default ctr_batch)
#   bash infra/airflow-backfills.sh cancel|pause|unpause BACKFILL_ID
# Reads AIRFLOW_HOME (source run/demo/env) for the admin password, AIRFLOW_PORT (default 8080).
set -euo pipefail
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
(($# >= 1)) || usage
action="$1"
URL="http://127.0.0.1:${AIRFLOW_PORT:-8080}"
passwords="${AIRFLOW_HOME:?set AIRFLOW_HOME (source run/demo/env)}/simple_auth_manager_passwords.json.generated"
[[ -r "$passwords" ]] || { echo "airflow-backfills: no password file at $passwords" >&2; exit 1; }
token="$(python3 - "$URL" "$passwords" << 'PY'
import json, sys, urllib.request
url, passwords = sys.argv[1], sys.argv[2]
body = json.dumps({"username": "admin", "password": json.load(open(passwords))["admin"]}).encode()
request = urllib.request.Request(f"{url}/auth/token", body, {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(request, timeout=30))["access_token"])
PY
)"
call() {  # METHOD PATH
    curl -fsS -X "$1" -H "Authorization: Bearer $token" "$URL/api/v2$2"
}
case "$action" in
    list)
        call GET "/backfills?dag_id=${2:-ctr_batch}&limit=100" | python3 -c '
import json, sys
found = json.load(sys.stdin)["backfills"]
print(len(found), "backfill(s)")
for b in found:
    state = "cancelled/done" if b["completed_at"] else ("paused" if b["is_paused"] else "running")
    print("  id {id}: {dag_id} {from_date} .. {to_date}, max_active_runs {max_active_runs}, ".format(**b) + state)'
        ;;
    cancel | pause | unpause)
        (($# == 2)) || usage
        call PUT "/backfills/$2/$action" > /dev/null
        echo "backfill $2: $action requested"
        ;;
    *) usage ;;
esac
