#!/usr/bin/env bash
# Control-plane overhead of the GPU path (issue 16) against the CPU path, on one `sim` worker
# with a simulated GPU: `hearth bench overhead` with 1 and 4 clients for a no-op, once as a CPU
# function and once as a `device: gpu` function scheduled by MQFQ-Sticky (D = 16, fixed, so no
# client waits for a token: the numbers are the scheduler's and executor's own cost).
#
#   bench/gpu-overhead.sh [seconds per run]     (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
secs=${1:-10}
H=${HEARTH_BIN:-target/release/hearth}
[ -x "$H" ] || cargo build --release -q -p hearth-cli
port=$(free_port)
bench_scratch
data="$tmp/data"
log="$tmp/worker.log"
HEARTH_CONCURRENCY=16 HEARTH_GPU__DEVICES=sim HEARTH_GPU__SIM='[{memory_mb=16384}]' \
    HEARTH_GPU__SCHEDULER__D=16 HEARTH_GPU__SCHEDULER__D_MAX=16 \
    HEARTH_GPU__SCHEDULER__DYNAMIC_D=false \
    "$H" worker --listen "127.0.0.1:$port" --data-dir "$data" --backend sim >"$log" 2>&1 &
pid=$!
url="http://127.0.0.1:$port"
wait_healthy "$url"
export HEARTH_API_KEY=$(key_of "$data")

echo "# hearth bench overhead, sim backend with one simulated GPU: $(nproc) CPUs, ${secs}s per run"
printf '%-22s %10s %8s %8s %8s %8s %8s\n' case "inv/s" "ovh p50" "ovh p90" "ovh p99" "e2e p50" "e2e p99"
for path in cpu gpu; do
    flag=""
    [ "$path" = gpu ] && flag="--gpu"
    for clients in 1 4; do
        j=$("$H" bench overhead --url "$url" --clients "$clients" --duration "${secs}s" $flag --json)
        overhead_row "no-op $path, $clients client$([ "$clients" = 1 ] || echo s)" "$j"
    done
done
