#!/usr/bin/env bash
# Simulator speed: a 1.2-million-invocation trace (500 functions, Poisson) through 8 simulated
# workers of 16 CPUs with CH-RLU + GDSF + EEDF, timed end to end (reading the trace, simulating,
# writing one CSV row per invocation). Prints each run's wall time and the median.
# Usage: bench/sim-speed.sh [RUNS=3]   (after cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
RUNS=${1:-3}
hearth_bin
work=$(mktemp -d /tmp/hearth-bench-sim.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$H" trace make poisson --rate 2000 --duration 600s --functions 500 \
    --warm-ms 10,50,100,200,500 --cold-ms 500 --mem-mb 128 --seed 1 \
    --target-concurrency 96 -o "$work/trace.csv" | sed -n 1p
echo "hearth sim: 8 workers × 16 CPUs, 32 GiB, ch-rlu + gdsf + eedf; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
times=()
for run in $(seq "$RUNS"); do
    start=$(date +%s.%N)
    "$H" sim --trace "$work/trace.csv" --workers 8 --cpus 16 --memory 32GiB --balance ch-rlu \
        --keepalive gdsf --queue eedf -o "$work/results.csv" >"$work/run.txt"
    end=$(date +%s.%N)
    t=$(python3 -c "print(f'{$end - $start:.2f}')")
    times+=("$t")
    echo "run $run: ${t} s wall; $(sed -n 3p "$work/run.txt")"
done
python3 -c "import statistics, sys; print(f'median {statistics.median(map(float, sys.argv[1:])):.2f} s over {len(sys.argv)-1} runs')" "${times[@]}"
