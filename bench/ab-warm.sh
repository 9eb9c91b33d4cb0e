#!/usr/bin/env bash
# A/B of the warm no-op path: two runc workers, built from two commits, side by side on one
# host, alternating short `hearth bench overhead` runs so that both see the same background load.
#
#   bench/ab-warm.sh BASE_BINARY NEW_BINARY [ROUNDS (6)] [CLIENTS (1)]
#
# Prints one line per run: which, invocations/s, overhead p50 (µs). Needs root and runc.
set -euo pipefail
BASE_BIN=$(realpath "${1:?base binary}"); NEW_BIN=$(realpath "${2:?new binary}"); shift 2
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_scratch
declare -A URL PID
for v in base new; do
  B=$([ $v = base ] && echo "$BASE_BIN" || echo "$NEW_BIN")
  port=$(free_port); d="$tmp/$v"
  HEARTH_CONCURRENCY=16 HEARTH_LOG=warn "$B" worker --listen 127.0.0.1:$port --data-dir $d --backend runc >$d.log 2>&1 &
  PID[$v]=$!; URL[$v]=http://127.0.0.1:$port
  wait_healthy ${URL[$v]}
done
for i in $(seq 1 ${1:-6}); do
  for v in base new; do
    j=$(HEARTH_API_KEY=$(key_of "$tmp/$v") "$NEW_BIN" bench overhead --url ${URL[$v]} --clients ${2:-1} --duration 3s --exec-ms 0 --json)
    python3 -c "import json,sys; j=json.loads(sys.argv[1]); print(sys.argv[2], round(j['throughput']), j['overhead_us']['p50'])" "$j" "$v"
  done
done
kill "${PID[base]}" "${PID[new]}"; wait || true
