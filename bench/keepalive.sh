#!/usr/bin/env bash
# Keep-alive policies on a real (sim-backend) worker: cold-start ratio and cold-start overhead for
# TTL, LRU and GDSF at three memory budgets (thesis ch. 3.6.1, Fig. 3.4, at small scale).
#
#   bench/keepalive.sh [OUT_DIR] [SCALE]      (default: bench/out/keepalive, 0.025)
#
# The workload is 100 functions of the Azure 2019 sample (representative: a quarter from each
# frequency quartile), one hour of the trace. The whole timeline is compressed by SCALE so that a
# run takes SCALE hours: inter-arrival times, execution and cold-start times, and TTL's 10 minutes
# alike, so the policies see the same workload shape as the uncompressed hour. Memory budgets are
# 25 %, 50 % and 100 % of the sum of the functions' memory (what keeping every function warm takes).
#
# Cold-start overhead = Σ init time / Σ execution time over all invocations (the thesis's
# "increase in execution time due to cold starts").
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
out=${1:-bench/out/keepalive}
scale=${2:-0.025}
H=${HEARTH_BIN:-target/release/hearth}
[ -x "$H" ] || cargo build --release -q -p hearth-cli
mkdir -p "$out"

"$H" trace make azure --invocations ../shared/traces/azure2019-invitro-sample/500_inv.csv \
    --sample representative:100 --minutes 60 --time-scale "$scale" --seed 3 -o "$out/trace.csv"
# Compress execution and cold-start times like the arrivals.
python3 - "$out/trace.meta.csv" "$scale" <<'PY'
import csv, sys
path, k = sys.argv[1], float(sys.argv[2])
rows = list(csv.DictReader(open(path)))
for r in rows:
    r["warm_ms"] = f'{float(r["warm_ms"]) * k:.3f}'
    r["cold_ms"] = f'{float(r["cold_ms"]) * k:.3f}'
    r["args"] = ""
with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)
PY
total_mb=$(python3 -c "import csv,sys; print(int(sum(float(r['mem_mb']) for r in csv.DictReader(open('$out/trace.meta.csv')))))")
ttl_s=$(python3 -c "print(max(1, round(600 * $scale)))")

for pct in 25 50 100; do
    budget=$((total_mb * pct / 100))
    for policy in ttl lru gdsf; do
        port=$(free_port)
        data=$(mktemp -d /tmp/hearth-bench-ka-XXXXXX)
        HEARTH_KEEPALIVE_TTL_S=$ttl_s HEARTH_FREE_BUFFER_MB=0 "$H" worker --backend sim \
            --listen "127.0.0.1:$port" --data-dir "$data" --cpus 64 --concurrency 1000 \
            --keepalive "$policy" --memory-mb "$budget" >"$data.log" 2>&1 &
        pid=$!
        wait_healthy "http://127.0.0.1:$port"
        export HEARTH_API_KEY=$(key_of "$data")
        echo "== $policy at $pct % ($budget MiB)" >&2
        "$H" load trace "$out/trace.csv" --url "http://127.0.0.1:$port" \
            -o "$out/$policy-$pct.csv" >"$out/$policy-$pct.load.txt" 2>&1
        kill -TERM "$pid"; wait "$pid" || true
        rm -rf "$data" "$data.log"
    done
done

python3 - "$out" "$total_mb" "$ttl_s" <<'PY'
import csv, sys
out, total, ttl = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"# keep-alive on a sim worker: 100 Azure functions, {total} MiB to keep all warm, TTL {ttl} s (10 min scaled)")
print(f"{'budget':>14} {'policy':>6} {'invocations':>11} {'cold':>6} {'cold %':>7} {'overhead %':>10} {'dropped':>7}")
for pct in (25, 50, 100):
    for policy in ("ttl", "lru", "gdsf"):
        rows = list(csv.DictReader(open(f"{out}/{policy}-{pct}.csv")))
        ok = [r for r in rows if r["outcome"] == "ok"]
        cold = sum(1 for r in ok if r["cold"] == "true")
        init = sum(int(r["init_us"] or 0) for r in ok)
        execs = sum(int(r["exec_us"] or 0) for r in ok)
        dropped = sum(1 for r in rows if r["outcome"] != "ok")
        print(f"{pct:>5} % {total * pct // 100:>5} MiB {policy:>6} {len(rows):>11} {cold:>6} "
              f"{100 * cold / max(1, len(ok)):>6.1f}% {100 * init / max(1, execs):>9.1f}% {dropped:>7}")
PY
