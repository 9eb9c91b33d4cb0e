#!/usr/bin/env bash
# ALPS live (issue 15): one `runc` worker on this machine's CPUs with an overcommitted
# concurrency limit, so the kernel (and the worker's --cpu-sched) decides who runs; a Huawei-like
# trace of CPU-bound `busy` calls (scripts/alps_live.py) at 70, 80 and 90 % CPU, replayed with
# `hearth load trace` under cfs, sfs and alps; then `hearth sim --cpu-sched` on the same traces.
# Prints mean / p99 execution duration per duration group (ALPS Figs. 5-6).
#
#   bench/alps-live.sh [OUT_DIR]        (default: bench/out/alps-live; after cargo build --release; root, runc)
#
# Environment: LOADS ("0.7 0.8 0.9"), SCHEDS ("cfs sfs alps"), DURATION (60 s per run, the first
# SKIP=15 s left out of the summary), CPUS (the machine's), CONCURRENCY (16), SIM_SCHEDS
# ("cfs sfs alps srpt ps").
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
out=${1:-bench/out/alps-live}
LOADS=${LOADS:-0.7 0.8 0.9}
SCHEDS=${SCHEDS:-cfs sfs alps}
SIM_SCHEDS=${SIM_SCHEDS:-cfs sfs alps srpt ps}
DURATION=${DURATION:-60}
SKIP=${SKIP:-15}
CPUS=${CPUS:-$(nproc)}
CONCURRENCY=${CONCURRENCY:-16}
mkdir -p "$out"
bench_scratch

for load in $LOADS; do
    trace="$out/trace-$load.csv"
    python3 scripts/alps_live.py make --cpus "$CPUS" --load "$load" --duration "$DURATION" \
        --seed 1 -o "$trace"
    runs=()
    for sched in $SCHEDS; do
        port=$(free_port)
        data="$tmp/$sched-$load"
        mkdir -p "$data"
        HEARTH_LOG=warn "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$data" \
            --cpus "$CPUS" --concurrency "$CONCURRENCY" --cpu-sched "$sched" \
            --memory-mb 8192 >"$data.log" 2>&1 &
        pid=$!
        wait_healthy "http://127.0.0.1:$port"
        export HEARTH_API_KEY=$(key_of "$data")
        echo "== live $sched at $load" >&2
        "$H" load trace "$trace" --url "http://127.0.0.1:$port" --prewarm \
            -o "$out/live-$sched-$load.csv" >"$out/live-$sched-$load.load.txt" 2>&1
        kill -TERM "$pid"
        wait "$pid" || true
        pid=
        runs+=("live $sched=$out/live-$sched-$load.csv")
    done
    for sched in $SIM_SCHEDS; do
        "$H" sim --trace "$trace" --workers 1 --cpus "$CPUS" --concurrency "$CONCURRENCY" \
            --memory 8GiB --prewarm --cpu-sched "$sched" -o "$out/sim-$sched-$load.csv" >/dev/null
        runs+=("sim $sched=$out/sim-$sched-$load.csv")
    done
    echo "## $load of $CPUS CPUs"
    python3 scripts/alps_live.py summary --skip-s "$SKIP" "${runs[@]}"
    echo
done | tee "$out/summary.md"
