#!/usr/bin/env bash
# Contention calibration for the simulator's `contention` server (issue 17 §2): one runc worker
# on this machine, the `busy` function spinning CPU time ({"cpu": true}, so lost CPU shows as a
# longer execution). Measures (scripts/contention.py):
#   * overcommit: execution time of W ms of CPU in rounds of N = 1, 2, 4, 8, 16 simultaneous
#     calls on N warm sandboxes (runnable sandboxes ÷ CPUs = N / CPUs), against the ideal PS
#     stretch max(1, N/c);
#   * creations: init time of K = 1, 2, 4, 8, 12 concurrent cold starts, with the worker's
#     default creation limit (its CPUs) and with it raised to 16;
#   * memory: a warm busy alone, beside a CPU-spinning sandbox, beside one that allocates and
#     touches HOG MiB per call.
# Runs at nice -10 (worker, runc and sandboxes inherit it) so that other builds on the machine
# take less of the CPUs; their load is printed. About 2-3 minutes.
#
# Usage: bench/contention.sh [WORK_MS] [ROUNDS] [HOG_MB]   (default 400 3 1024; root, runc)
# Environment: HEARTH (binary, default target/release/hearth).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
WORK=${1:-400}
ROUNDS=${2:-3}
HOG=${3:-1024}

bench_scratch

start_worker() {
    local creations=$1 port
    port=$(free_port); dir="$tmp/w-$creations"; url="http://127.0.0.1:$port"
    HEARTH_GENERIC_POOL=0 HEARTH_CONCURRENCY=32 HEARTH_MEMORY_MB=8192 \
        HEARTH_MAX_CONCURRENT_CREATIONS=$creations HEARTH_LOG=warn \
        nice -n -10 "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$dir" \
        2>"$dir.log" &
    pid=$!
    wait_healthy "$url"
    export HEARTH_API_KEY=$(key_of "$dir")
}
stop_worker() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

echo "# bench contention: $(nproc) CPUs, busy {\"ms\": $WORK, \"cpu\": true} ×$ROUNDS rounds, runc, $(date -u +%FT%TZ)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
{
    start_worker 0
    nice -n -10 python3 scripts/contention.py overcommit "$url" --work-ms "$WORK" --rounds "$ROUNDS"
    nice -n -10 python3 scripts/contention.py creations "$url" --rounds 3 | sed 's/"creations"/"creations-cap"/'
    nice -n -10 python3 scripts/contention.py memory "$url" --work-ms 100 --hog-mb "$HOG"
    stop_worker
    start_worker 16
    nice -n -10 python3 scripts/contention.py creations "$url" --rounds 3
    stop_worker
} >"$tmp/runs"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/runs" "$(nproc)" <<'PY'
import json, statistics, sys
cpus = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = statistics.median
def p(v, q):
    v = sorted(v); return v[min(len(v) - 1, int(q / 100 * len(v)))] if v else float("nan")
print(f"{'overcommit N':<14}{'N/c':>6}{'calls':>7}{'exec p50':>10}{'exec mean':>11}{'stretch':>9}{'PS':>6}{'excess':>8}{'round/PS':>10}")
for r in rows:
    if r["kind"] != "overcommit" or not r["samples"]:
        continue
    n, w = r["x"], r["work_ms"]
    mean = statistics.fmean(r["samples"]) / 1000
    ps = max(1.0, n / cpus)
    print(f"{n:<14}{n/cpus:>6.1f}{len(r['samples']):>7}{med(r['samples'])/1000:>10.1f}{mean:>11.1f}"
          f"{mean/w:>9.3f}{ps:>6.1f}{mean/w/ps:>8.3f}{med(r['walls'])/1000/w/ps:>10.3f}")
for kind, title in (("creations-cap", "creations (limit = CPUs)"), ("creations", "creations (limit 16)")):
    print(f"{title:<26}{'K':>4}{'n':>5}{'init p50':>10}{'init mean':>11}{'init max':>10}")
    for r in rows:
        if r["kind"] == kind and r["samples"]:
            s = r["samples"]
            print(f"{'':<26}{r['x']:>4}{len(s):>5}{med(s)/1000:>10.1f}{statistics.fmean(s)/1000:>11.1f}{max(s)/1000:>10.1f}")
print(f"{'memory':<14}{'calls':>7}{'exec p50':>10}{'exec mean':>11}{'p90':>8}")
for r in rows:
    if r["kind"] == "memory" and r["samples"]:
        s = r["samples"]
        print(f"{r['x']:<14}{len(s):>7}{med(s)/1000:>10.1f}{statistics.fmean(s)/1000:>11.1f}{p(s,90)/1000:>8.1f}")
PY
echo "# raw: one JSON line per setting (µs)"
cat "$tmp/runs"
