#!/usr/bin/env bash
# Control-plane overhead, throughput, cold starts and idle CPU of a single worker.
#
#   bench/overhead.sh [runc|sim] [seconds per run]     (default: runc 10)
#
# Starts its own worker on a free loopback port with a throw-away data directory, runs
# `hearth bench overhead` with 1 and 4 clients for a no-op and a 12 ms function, `hearth bench
# cold` (runc only), and measures the idle worker's CPU use over 10 s. Extra worker settings come
# from the environment (e.g. HEARTH_LOW_LATENCY=false). Prints one table; needs root for runc.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
backend=${1:-runc}
secs=${2:-10}
H=${HEARTH_BIN:-target/release/hearth}
[ -x "$H" ] || cargo build --release -q -p hearth-cli
port=$(free_port)
bench_scratch
data="$tmp/data"
log="$tmp/worker.log"
# The concurrency limit defaults to the CPUs (2 here): 4 clients of the sleeping function would
# wait in the queue by design. The benchmark measures the control plane, not the regulator.
HEARTH_CONCURRENCY=${HEARTH_CONCURRENCY:-16} "$H" worker --listen "127.0.0.1:$port" \
    --data-dir "$data" --backend "$backend" >"$log" 2>&1 &
pid=$!
url="http://127.0.0.1:$port"
wait_healthy "$url"
export HEARTH_API_KEY=$(key_of "$data")

echo "# hearth bench overhead: backend $backend, $(nproc) CPUs, ${secs}s per run, low_latency=${HEARTH_LOW_LATENCY:-true}"
printf '%-22s %10s %8s %8s %8s %8s %8s\n' case "inv/s" "ovh p50" "ovh p90" "ovh p99" "e2e p50" "e2e p99"
for exec_ms in 0 12; do
    for clients in 1 4; do
        j=$("$H" bench overhead --url "$url" --clients "$clients" --duration "${secs}s" --exec-ms "$exec_ms" --json)
        name=$([ "$exec_ms" = 0 ] && echo "no-op" || echo "sleep $exec_ms ms")", $clients client"$([ "$clients" = 1 ] || echo s)
        overhead_row "$name" "$j"
    done
done
if [ "$backend" = runc ]; then
    "$H" bench cold --url "$url" -n 20 | tail -n +2
fi
# Idle CPU: a warm sandbox exists, no traffic, 10 s of the worker's user+system time.
sleep 2
t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
sleep 10
t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
hz=$(getconf CLK_TCK)
python3 -c "print('idle worker CPU: %.2f %% of a core' % (($t1 - $t0) / $hz / 10 * 100))"
