#!/usr/bin/env bash
# Controller overhead: closed-loop warm no-op invocations through a controller + worker vs the
# same worker alone, alternating the two so that machine noise hits both. Prints each run and the
# medians, and the difference of the p50s and p99s (client-observed overhead = e2e − exec).
#
# Usage: bench/controller-overhead.sh [DURATION] [ROUNDS]      (defaults: 10s, 3)
# Environment: HEARTH (binary, default target/release/hearth), BACKEND (sim|runc, default sim),
#              BALANCE (default ch-rlu), CLIENTS (default 1), ATOLL (a ladder rung, e.g. atoll: the
#              controller runs Atoll's routing and allocator and the worker lends a 1 GiB
#              proactive pool; default off).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
DUR=${1:-10s}
ROUNDS=${2:-3}
BACKEND=${BACKEND:-sim}
BALANCE=${BALANCE:-ch-rlu}
CLIENTS=${CLIENTS:-1}
ATOLL=${ATOLL:-}
worker_extra=()
controller_env=()
if [ -n "$ATOLL" ]; then
    controller_env=("HEARTH_ATOLL__LADDER=$ATOLL")
    worker_extra=(--proactive-mb 1024)
fi

tmp=$(mktemp -d /tmp/hearth-bench-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

CPORT=$(free_port)
WPORT=$(free_port)
CURL="http://127.0.0.1:$CPORT"
WURL="http://127.0.0.1:$WPORT"

env "${controller_env[@]}" HEARTH_LOG=warn "$H" controller --listen "127.0.0.1:$CPORT" --data-dir "$tmp/controller" \
    --balance "$BALANCE" 2>"$tmp/controller.log" &
pids+=($!)
wait_healthy "$CURL"
# The worker joins with the controller's cluster key (a binary without authentication has none).
if wait_file "$tmp/controller/cluster.key"; then
    export HEARTH_CLUSTER_KEY_FILE="$tmp/controller/cluster.key"
fi
HEARTH_LOG=warn HEARTH_WORKER_ID=bench-worker "$H" worker --backend "$BACKEND" \
    --listen "127.0.0.1:$WPORT" --data-dir "$tmp/worker" --controller "$CURL" "${worker_extra[@]}" \
    2>"$tmp/worker.log" &
pids+=($!)
wait_healthy "$WURL"
CKEY=$(key_of "$tmp/controller")
WKEY=$(key_of "$tmp/worker")
for _ in $(seq 100); do
    if HEARTH_API_KEY=$CKEY "$H" status --url "$CURL" 2>/dev/null | grep -q '"workers_up": 1'; then break; fi
    sleep 0.1
done
HEARTH_API_KEY=$CKEY "$H" status --url "$CURL" | grep -q '"workers_up": 1' || { cat "$tmp"/*.log >&2; exit 1; }

echo "controller overhead: $ROUNDS rounds of $DUR per path, $CLIENTS client(s), backend $BACKEND, policy $BALANCE${ATOLL:+, atoll ladder $ATOLL}"
for r in $(seq "$ROUNDS"); do
    for path in worker controller; do
        url=$WURL; key=$WKEY; [ "$path" = controller ] && url=$CURL && key=$CKEY
        HEARTH_API_KEY=$key "$H" bench overhead --url "$url" --duration "$DUR" --clients "$CLIENTS" --json \
            | sed "s/^/{\"path\":\"$path\",\"round\":$r,\"run\":/; s/\$/}/" >>"$tmp/runs.jsonl"
    done
done
python3 - "$tmp/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = lambda path, key, q: statistics.median(r["run"][key][q] for r in runs if r["path"] == path)
for r in runs:
    o = r["run"]
    print(f'round {r["round"]} {r["path"]:<10} overhead p50 {o["overhead_us"]["p50"]:>5} µs  p99 {o["overhead_us"]["p99"]:>6} µs'
          f'  controller p50 {o["controller_us"]["p50"]:>4} p99 {o["controller_us"]["p99"]:>5}'
          f'  {o["throughput"]:>7} inv/s  errors {o["errors"]}')
for q in ("p50", "p99"):
    w, c = med("worker", "overhead_us", q), med("controller", "overhead_us", q)
    print(f'median {q}: worker alone {w} µs, through controller {c} µs, difference {c - w} µs'
          f' (controller\'s own timing.controller {q}: {med("controller", "controller_us", q)} µs)')
PY
