#!/usr/bin/env bash
# Queue disciplines on a saturated worker (thesis ch. 5.5.2): a sim-backend worker with 16
# simulated CPUs and a concurrency limit of 16, an open-loop workload of 13 ms and several-second
# functions with one function bursting, replayed once per discipline.
#
#   bench/queue.sh [OUT_DIR] [SECONDS]        (default: bench/out/queue, 120)
#
# Prints, per discipline, the weighted normalized latency (DESIGN.md §7: each invocation's e2e over
# its function's unloaded warm time, averaged over invocations), the mean stretch per function,
# the cold starts and the queueing; writes the comparison plots into OUT_DIR/report.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
out=${1:-bench/out/queue}
secs=${2:-120}
H=${HEARTH_BIN:-target/release/hearth}
[ -x "$H" ] || cargo build --release -q -p hearth-cli
mkdir -p "$out"

# Background: 8 functions cycling 300 ms, 13 ms ×4, 3 s, 13 ms, 6 s at 9/s: about 10.5 busy CPUs
# of 16 on average. The burst function (300 ms, the first warm time) adds 18/s (5.4 CPUs) for a
# third of the run, from a quarter in: the worker is saturated while it lasts.
"$H" trace make burst --rate 9 --duration "${secs}s" --functions 8 \
    --warm-ms 300,13,13,13,13,3000,13,6000 --cold-ms 500 --mem-mb 128 \
    --burst-rate 18 --burst-at "$((secs / 4))s" --burst-length "$((secs / 3))s" \
    --seed 7 -o "$out/trace.csv"

results=()
labels=()
for q in fcfs sjf eedf rare srsf; do
    port=$(free_port)
    data=$(mktemp -d /tmp/hearth-bench-q-XXXXXX)
    "$H" worker --backend sim --listen "127.0.0.1:$port" --data-dir "$data" \
        --cpus 16 --concurrency 16 --queue "$q" --memory-mb 65536 >"$data.log" 2>&1 &
    pid=$!
    wait_healthy "http://127.0.0.1:$port"
    export HEARTH_API_KEY=$(key_of "$data")
    echo "== $q" >&2
    "$H" load trace "$out/trace.csv" --url "http://127.0.0.1:$port" --prewarm \
        -o "$out/$q.csv" >"$out/$q.load.txt" 2>&1
    kill -TERM "$pid"; wait "$pid" || true
    rm -rf "$data" "$data.log"
    results+=("$out/$q.csv")
    labels+=(--label "$q")
done
"$H" report "${results[@]}" "${labels[@]}" --meta "$out/trace.meta.csv" -o "$out/report"
