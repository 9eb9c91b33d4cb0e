#!/usr/bin/env bash
# Balancing policies on a real cluster (a controller and 4 sim-backend workers, `hearth up
# --workers 4`): least-loaded, CH-BL and CH-RLU on the same Azure trace (CH-RLU paper, Fig. 8).
#
#   bench/balance.sh [OUT_DIR] [MINUTES]      (default: bench/out/balance, 5)
#
# The workload is 98 functions of the Azure 2019 sample (`representative:100`, seed 5), the first
# MINUTES of the trace in real time, each mapped to the closest FunctionBench-like function's warm
# time with the trace's cold-start cost (`--map functionbench`: warm 0.4 ms–8.5 s, cold starts
# 11 s on average) — about 16 invocations running at once. Each worker has 8 simulated CPUs and a
# concurrency limit of 64 (like the CH-RLU paper's OpenWhisk invokers, every invocation starts at
# once, so the reported load can exceed 1 and the bounds matter), and memory for half of the
# functions' sandboxes: the cluster can keep every function warm twice, so where a function lands
# decides whether it finds a warm sandbox. The `sim` backend sleeps the times (no CPU contention):
# the policies differ by cold starts and by how evenly they spread the running invocations. A run
# takes MINUTES plus the last cold starts per policy.
#
# Prints per policy: weighted normalized latency (e2e over the function's warm time, averaged over
# invocations), cold ratio, drops, and the per-worker load spread (each worker's busy time —
# init + exec of its invocations — divided by the run's length: its mean number of busy CPUs; and
# the coefficient of variation of that across workers).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
out=${1:-bench/out/balance}
minutes=${2:-5}
H=${HEARTH_BIN:-target/release/hearth}
[ -x "$H" ] || cargo build --release -q -p hearth-cli
mkdir -p "$out"

"$H" trace make azure --invocations ../shared/traces/azure2019-invitro-sample/500_inv.csv \
    --sample representative:100 --minutes "$minutes" --time-scale 1 --seed 5 --map functionbench \
    -o "$out/trace.csv"
total_mb=$(python3 -c "import csv; print(int(sum(float(r['mem_mb']) for r in csv.DictReader(open('$out/trace.meta.csv')))))")
per_worker=$((total_mb / 2))

for policy in least-loaded ch-bl ch-rlu; do
    port=$(free_port)
    data=$(mktemp -d /tmp/hearth-bench-bal-XXXXXX)
    HEARTH_FREE_BUFFER_MB=0 "$H" up --workers 4 --backend sim --balance "$policy" \
        --listen "127.0.0.1:$port" --data-dir "$data" --cpus 8 --concurrency 64 \
        --memory-mb "$per_worker" >"$data.log" 2>&1 &
    pid=$!
    wait_workers "http://127.0.0.1:$port" "$data" 4
    echo "== $policy ($per_worker MiB per worker)" >&2
    "$H" load trace "$out/trace.csv" --url "http://127.0.0.1:$port" \
        -o "$out/$policy.csv" >"$out/$policy.load.txt" 2>&1
    kill -TERM "$pid"; wait "$pid" || true
    rm -rf "$data" "$data.log"
done

python3 - "$out" <<'PY'
import csv, statistics, sys
out = sys.argv[1]
meta = {r["function"]: float(r["warm_ms"]) * 1000 for r in csv.DictReader(open(f"{out}/trace.meta.csv"))}
print(f"{'policy':<13} {'invocations':>11} {'wnl':>8} {'e2e p50 ms':>10} {'e2e p99 ms':>10} "
      f"{'cold %':>7} {'dropped':>7} {'busy CPUs per worker':>24} {'CoV':>5}")
for policy in ("least-loaded", "ch-bl", "ch-rlu"):
    rows = list(csv.DictReader(open(f"{out}/{policy}.csv")))
    ok = [r for r in rows if r["outcome"] == "ok"]
    span = (max(int(r["scheduled_us"]) + int(r["e2e_us"]) for r in ok) - min(int(r["scheduled_us"]) for r in ok)) or 1
    wnl = statistics.mean(int(r["e2e_us"]) / max(meta[r["function"]], 1.0) for r in ok)
    e2e = sorted(int(r["e2e_us"]) / 1000 for r in ok)
    cold = sum(r["cold"] == "true" for r in ok)
    busy = {}
    for r in ok:
        busy[r["worker"]] = busy.get(r["worker"], 0) + int(r["init_us"] or 0) + int(r["exec_us"] or 0)
    shares = sorted(b / span for b in busy.values())
    cov = statistics.pstdev(shares) / statistics.mean(shares) if shares else 0
    print(f"{policy:<13} {len(rows):>11} {wnl:>8.2f} {e2e[len(e2e)//2]:>10.1f} {e2e[int(len(e2e)*0.99)]:>10.1f} "
          f"{100*cold/len(ok):>6.1f}% {len(rows)-len(ok):>7} {' '.join(f'{s:5.2f}' for s in shares):>24} {cov:>5.2f}")
PY
