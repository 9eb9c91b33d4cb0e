#!/usr/bin/env bash
# CPU per warm no-op invocation on a runc worker, split into the worker process and the sandbox
# (the agent, from its cgroup's cpuacct), with 1 and 4 closed-loop clients. Less sensitive to a
# noisy host than latency: it says where an invocation's CPU goes. Alternates the binaries given
# (e.g. a build of main before a change and one after), ROUNDS times.
#
# Usage: bench/warm-cpu.sh [ROUNDS] [BINARY...]   (default 3 target/release/hearth; needs root, runc)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ROUNDS=${1:-3}; shift || true
BINS=("$@"); [ ${#BINS[@]} -gt 0 ] || BINS=(target/release/hearth)
hz=$(getconf CLK_TCK)
bench_scratch
# The sandboxes' CPU, in ns, summed over this worker's cgroups.
sandbox_ns() { cat /sys/fs/cgroup/cpuacct/hearth/"$1"/hearth-*/cpuacct.usage | awk '{s+=$1} END {printf "%d", s}'; }

run() {
    local bin=$1 clients=$2 r=$3 port dir url id
    port=$(free_port); dir="$tmp/$r-$clients-$(basename "$bin")"; url="http://127.0.0.1:$port"
    id="bench_cpu_$port"
    HEARTH_WORKER_ID=$id HEARTH_GENERIC_POOL=0 HEARTH_CONCURRENCY=16 HEARTH_LOG=warn \
        "$bin" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$dir" 2>"$dir.log" &
    pid=$!
    wait_healthy "$url"
    export HEARTH_API_KEY=$(key_of "$dir")
    "$bin" bench overhead --url "$url" --clients 1 --duration 1s --json >/dev/null  # the sandbox
    local w0 a0 w1 a1 j
    w0=$(awk '{print $14+$15}' "/proc/$pid/stat"); a0=$(sandbox_ns "$id")
    j=$("$bin" bench overhead --url "$url" --clients "$clients" --duration 5s --warmup 0s --json)
    w1=$(awk '{print $14+$15}' "/proc/$pid/stat"); a1=$(sandbox_ns "$id")
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
    echo "$bin $clients $((w1 - w0)) $((a1 - a0)) $j"
}

for r in $(seq "$ROUNDS"); do
    for clients in 1 4; do
        for b in "${BINS[@]}"; do run "$b" "$clients" "$r"; done
    done
done >"$tmp/runs"
python3 - "$tmp/runs" "$hz" <<'PY'
import json, statistics, sys
hz = int(sys.argv[2])
rows = {}
for line in open(sys.argv[1]):
    b, c, wt, an, j = line.split(" ", 4)
    j = json.loads(j)
    n = j["throughput"] * 5
    rows.setdefault((b, c), []).append((j["throughput"], j["e2e_us"]["p50"], int(wt) / hz * 1e6 / n, int(an) / 1e3 / n))
med = statistics.median
print(f"{'binary':<34}{'clients':>8}{'inv/s':>8}{'e2e p50':>9}{'worker µs/inv':>15}{'agent µs/inv':>14}")
for (b, c), v in rows.items():
    print(f"{b:<34}{c:>8}{med(x[0] for x in v):>8.0f}{med(x[1] for x in v):>9.0f}"
          f"{med(x[2] for x in v):>15.1f}{med(x[3] for x in v):>14.1f}")
PY
