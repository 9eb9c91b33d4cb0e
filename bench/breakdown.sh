#!/usr/bin/env bash
# Latency breakdown vs concurrency (measurement study, WoSC '21 §3.3, Fig. 7): one `runc`
# worker, one CPU-bound function (`busy`, 100 ms of CPU per call, 256 MiB), Poisson arrivals at
# RATE/s (default 12/s: 60 % of this 2-CPU machine), replayed open loop against the worker with
# its concurrency limit at 2, 4, 6, 8, 10 and 12, starting cold each time. Prints the p50 / p99
# of each phase of the end-to-end latency: wait (queue), initialization (cold starts), execution.
#
#   bench/breakdown.sh [OUT_DIR] [SECONDS]   (default: bench/out/breakdown, 30; root, runc)
# Environment: RATE (12), LIMITS ("2 4 6 8 10 12").
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
out=${1:-bench/out/breakdown}
secs=${2:-30}
RATE=${RATE:-12}
LIMITS=${LIMITS:-2 4 6 8 10 12}
mkdir -p "$out"
bench_scratch

"$H" trace make poisson --rate "$RATE" --duration "${secs}s" --functions 1 --warm-ms 100 \
    --mem-mb 256 --seed 3 -o "$out/trace.csv" | sed -n 1p
# The call spins 100 ms of CPU time: less CPU, longer execution.
python3 - "$out/trace.meta.csv" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
for r in rows:
    r["sample"] = "busy"
    r["args"] = json.dumps({"ms": float(r["warm_ms"]), "cpu": True}, separators=(",", ":"))
with open(sys.argv[1], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
PY

for limit in $LIMITS; do
    port=$(free_port)
    data="$tmp/c$limit"
    mkdir -p "$data"
    HEARTH_LOG=warn "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$data" \
        --concurrency "$limit" --memory-mb 8192 >"$data.log" 2>&1 &
    pid=$!
    wait_healthy "http://127.0.0.1:$port"
    export HEARTH_API_KEY=$(key_of "$data")
    echo "== concurrency $limit" >&2
    "$H" load trace "$out/trace.csv" --url "http://127.0.0.1:$port" \
        -o "$out/c$limit.csv" >"$out/c$limit.load.txt" 2>&1
    kill -TERM "$pid"
    wait "$pid" || true
    pid=
done

python3 - "$out" $LIMITS <<'PY' | tee "$out/summary.md"
import csv, math, sys
out, limits = sys.argv[1], sys.argv[2:]
def pct(v, p):
    v = sorted(v)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)] if v else 0.0
print("| concurrency | e2e p50 / p99 ms | wait p50 / p99 | init p99 (cold starts) | exec p50 / p99 | share of mean e2e: wait / init / exec |")
print("|---:|---|---|---|---|---|")
for c in limits:
    rows = [r for r in csv.DictReader(open(f"{out}/c{c}.csv")) if r["outcome"] == "ok"]
    ms = lambda k: [int(r[k]) / 1000 for r in rows]
    e2e, wait, init, ex = ms("e2e_us"), ms("queue_us"), ms("init_us"), ms("exec_us")
    cold = [i for i, r in zip(init, rows) if r["cold"] == "true"]
    tot = sum(e2e) or 1.0
    print(f"| {c} | {pct(e2e, 50):,.0f} / {pct(e2e, 99):,.0f} | {pct(wait, 50):,.0f} / {pct(wait, 99):,.0f} | "
          f"{pct(cold, 99):,.0f} ({len(cold)}) | {pct(ex, 50):,.0f} / {pct(ex, 99):,.0f} | "
          f"{100 * sum(wait) / tot:.0f} / {100 * sum(init) / tot:.0f} / {100 * sum(ex) / tot:.0f} % |")
PY
