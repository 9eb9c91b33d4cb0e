#!/usr/bin/env bash
# Simulator fidelity (thesis Fig. 5.10): the same trace through a real worker with the sim
# backend (`hearth load trace`) and through the simulator (`hearth sim`), with the same CPUs,
# concurrency limit, queue, keep-alive, memory and Little's-law prewarming; then the comparison
# (`hearth experiment fidelity`: latency, cold starts, queue length and running over time) and
# `hearth report` of both.
# Usage: bench/sim-fidelity.sh [OUT=/tmp/hearth-fidelity]   (after cargo build --release)
#   CPUS=4 LIMIT=4 DURATION=45s: the worker's CPUs, its concurrency limit, the trace's length.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
OUT=${1:-/tmp/hearth-fidelity}
CPUS=${CPUS:-4}
LIMIT=${LIMIT:-$CPUS}
DURATION=${DURATION:-45s}
hearth_bin
mkdir -p "$OUT"
work=$(mktemp -d /tmp/hearth-bench-fidelity.XXXXXX)
port=$(free_port)
# Six function sizes, 250 ms cold starts; time scaled so that Little's law gives 90 % of the
# CPUs: the queue fills in bursts.
target=$(python3 -c "print(0.9 * $CPUS)")
"$H" trace make poisson --rate 50 --duration "$DURATION" --functions 12 \
    --warm-ms 10,25,50,100,200,400 --cold-ms 250 --mem-mb 128 --seed 1 \
    --target-concurrency "$target" -o "$OUT/trace.csv" | sed -n 1p
HEARTH_LOG=warn "$H" worker --listen "127.0.0.1:$port" --backend sim --data-dir "$work/data" \
    --cpus "$CPUS" --concurrency "$LIMIT" --memory-mb 8192 --queue eedf --keepalive ttl \
    2>"$work/worker.log" &
worker=$!
trap 'kill "$worker" 2>/dev/null; wait "$worker" 2>/dev/null; rm -rf "$work"' EXIT
wait_healthy "http://127.0.0.1:$port" 0.05
export HEARTH_API_KEY=$(key_of "$work/data")
echo "real worker (sim backend, $CPUS CPUs, concurrency $LIMIT):"
"$H" load trace "$OUT/trace.csv" --url "http://127.0.0.1:$port" --prewarm -o "$OUT/real.csv" \
    | grep -E 'e2e p50|cold starts|answered'
echo "simulator:"
"$H" sim --trace "$OUT/trace.csv" --workers 1 --cpus "$CPUS" --concurrency "$LIMIT" \
    --memory 8GiB --queue eedf --keepalive ttl --balance round-robin --prewarm -o "$OUT/sim.csv" \
    | sed -n 2,3p
"$H" report "$OUT/real.csv" "$OUT/sim.csv" --label real --label sim --meta "$OUT/trace.meta.csv" \
    -o "$OUT/report" >"$OUT/report.txt"
"$H" experiment fidelity --real "$OUT/real.csv" --sim "$OUT/sim.csv" \
    --meta "$OUT/trace.meta.csv" -o "$OUT/fidelity" | sed '/^wrote/d'
