#!/usr/bin/env bash
# Atoll's ladder (Table 1) on a live cluster and in the simulator, on the same trace: a
# controller with `[atoll]` in front of 3 `sim`-backend workers (`hearth up --workers 3`), one
# group per worker, each lending a proactive pool; then `hearth sim` with the same cluster.
# Prints % deadlines missed (overall and per class), cold starts and p99.9 per rung and side
# (scripts/atoll_summary.py).
#
#   bench/atoll-live.sh [OUT_DIR]        (default: bench/out/atoll-live; after cargo build --release)
#
# Environment: WORKLOAD (1), APPS (12), DURATION (5s of paper time, stretched to the target
# concurrency: about 60 s), CPUS (64 simulated CPUs per worker), TARGET (the trace's
# mean concurrency, default 0.9 × all CPUs), MEMORY (32768 MiB per worker), PROACTIVE (16384 MiB of
# it), RUNGS ("gfr gdr gdpi atoll d-atoll"), BACKEND (sim; runc needs functions with code: the
# trace's `busy` sample, its memory not touched per call; e.g. BACKEND=runc APPS=4 CPUS=1 TARGET=1.2
# MEMORY=4096 PROACTIVE=2048).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
out=${1:-bench/out/atoll-live}
WORKLOAD=${WORKLOAD:-1}
APPS=${APPS:-12}
DURATION=${DURATION:-5s}
CPUS=${CPUS:-64}
TARGET=${TARGET:-$(python3 -c "print(0.9 * 3 * $CPUS)")}
MEMORY=${MEMORY:-32768}
PROACTIVE=${PROACTIVE:-16384}
RUNGS=${RUNGS:-gfr gdr gdpi atoll d-atoll}
BACKEND=${BACKEND:-sim}
GROUP=${GROUP:-1}
mkdir -p "$out"

"$H" trace make atoll --workload "$WORKLOAD" --apps "$APPS" --duration "$DURATION" --seed 1 \
    --target-concurrency "$TARGET" -o "$out/trace.csv" | sed -n 1p
if [ "$BACKEND" = runc ]; then
    # Real sandboxes on a small machine: `busy` spins its ms without touching its memory each
    # call (the registered memory stays), so the CPUs go to the functions' work.
    python3 - "$out/trace.meta.csv" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
for r in rows:
    a = json.loads(r["args"]); a["mb"] = 0; r["args"] = json.dumps(a, separators=(",", ":"))
with open(sys.argv[1], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
PY
fi

runs=()
for rung in $RUNGS; do
    queue=srsf
    [ "$rung" = gfr ] && queue=fcfs
    # Reactive rungs lend no proactive pool (as the simulator's rungs).
    pro=$PROACTIVE
    case "$rung" in gfr | gdr) pro=0 ;; esac
    port=$(free_port)
    data=$(mktemp -d /tmp/hearth-bench-atoll-XXXXXX)
    HEARTH_ATOLL__LADDER=$rung HEARTH_ATOLL__GROUP_SIZE=$GROUP HEARTH_FREE_BUFFER_MB=0 HEARTH_LOG=warn \
        "$H" up --workers 3 --backend "$BACKEND" --listen "127.0.0.1:$port" --data-dir "$data" \
        --cpus "$CPUS" --concurrency "$CPUS" --queue "$queue" --keepalive ttl \
        --memory-mb "$MEMORY" --proactive-mb "$pro" >"$data.log" 2>&1 &
    pid=$!
    wait_workers "http://127.0.0.1:$port" "$data" 3
    echo "== live $rung" >&2
    "$H" load trace "$out/trace.csv" --url "http://127.0.0.1:$port" \
        -o "$out/live-$rung.csv" >"$out/live-$rung.load.txt" 2>&1
    kill -TERM "$pid"
    wait "$pid" || true
    rm -rf "$data" "$data.log"
    echo "== sim $rung" >&2
    "$H" sim --trace "$out/trace.csv" --workers 3 --cpus "$CPUS" --concurrency "$CPUS" \
        --memory "${MEMORY}MiB" --queue "$queue" --keepalive ttl --balance atoll --ladder "$rung" \
        --group-size "$GROUP" --proactive-share "$(python3 -c "print($PROACTIVE / $MEMORY)")" \
        -o "$out/sim-$rung.csv" >/dev/null
    runs+=("live-$rung=$out/live-$rung.csv" "sim-$rung=$out/sim-$rung.csv")
done
python3 scripts/atoll_summary.py "$out/trace.meta.csv" "${runs[@]}" | tee "$out/summary.txt"
