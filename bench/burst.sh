#!/usr/bin/env bash
# A burst that finds too few warm sandboxes (issue 13): a runc worker with concurrency 16, the
# no-op function prewarmed with 4 sandboxes, then 16 closed-loop connections for 4 s, driven by
# `hearth bench overhead` and by a third-party HTTP load tool (`wrk`, Debian's package). Prints
# per client and setting: throughput, latency p50/p90/p99/max, the cold starts and the sum of
# their init times (from the worker's metrics).
#
# Settings, alternating:
#   before        generic_pool = 0, warm_wait off  (issue 13's starting point, with the creation cap)
#   generic       the generic pool (default 4), warm_wait off
#   generic+wait  the generic pool and warm_wait on
#
# wrk's latency percentiles are unreliable when a few connections stall (it corrects for
# coordinated omission with a fixed rate model), so its mean is cross-checked with Little's law:
# mean latency ≈ connections ÷ throughput.
#
# Usage: bench/burst.sh [ROUNDS]      (default 3; needs root, runc and wrk)
# Environment: HEARTH (binary, default target/release/hearth).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
ROUNDS=${1:-3}
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }

bench_scratch
wrk_post_script "$tmp/post.lua"

start_worker() {
    local setting=$1 dir=$2 port=$3 pool=4 wait=false
    case $setting in
        before) pool=0 ;;
        generic+wait) wait=true ;;
    esac
    HEARTH_CONCURRENCY=16 HEARTH_GENERIC_POOL=$pool HEARTH_WARM_WAIT=$wait HEARTH_LOG=warn \
        "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$dir" 2>"$dir.log" &
    pid=$!
    wait_healthy "http://127.0.0.1:$port"
    export HEARTH_API_KEY=$(key_of "$dir")
}

stop_worker() {
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
}

# The worker's cold starts and the sum of their init seconds, as "count sum".
init_metrics() {
    curl -sf -H "Authorization: Bearer $HEARTH_API_KEY" "$1/metrics" | awk '
        /^hearth_invocation_init_seconds_sum/ {s += $NF}
        /^hearth_invocation_init_seconds_count/ {c += $NF}
        END {printf "%d %.3f", c, s}'
}

run_hearth() {
    local setting=$1 r=$2 port dir url j
    port=$(free_port); dir="$tmp/h-$setting-$r"; url="http://127.0.0.1:$port"
    start_worker "$setting" "$dir" "$port"
    # The pool at rest before the burst, as a worker between bursts would be.
    sleep 1
    j=$("$H" bench overhead --url "$url" --clients 16 --prewarm 4 --duration 4s --warmup 0s --json)
    echo "hearth $setting $r $(init_metrics "$url") $j"
    stop_worker
}

run_wrk() {
    local setting=$1 r=$2 port dir url out
    port=$(free_port); dir="$tmp/w-$setting-$r"; url="http://127.0.0.1:$port"
    start_worker "$setting" "$dir" "$port"
    prewarmed_noop "$url" 4
    sleep 1
    out=$(wrk -t2 -c16 -d4s --latency -s "$tmp/post.lua" \
        -H "Authorization: Bearer $HEARTH_API_KEY" "$url/v1/functions/noop/invoke")
    echo "wrk $setting $r $(init_metrics "$url") $(echo "$out" | python3 -c '
import json, re, sys
t = sys.stdin.read()
def us(v, unit):
    return float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]
lat = re.search(r"Latency\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", t)
pct = {p: us(v, u) for p, v, u in re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s)", t, re.M)}
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
errors = sum(int(x) for x in re.findall(r"(?:Non-2xx or 3xx responses|Socket errors:.*?timeout)\D+(\d+)", t))
print(json.dumps({"throughput": rps, "mean": us(lat.group(1), lat.group(2)), "max": us(lat.group(5), lat.group(6)),
                  "p50": pct.get("50"), "p90": pct.get("90"), "p99": pct.get("99"), "errors": errors}))
')"
    stop_worker
}

echo "# burst: 16 connections, 4 prewarmed, 4 s, runc, $(nproc) CPUs, $ROUNDS rounds"
for r in $(seq "$ROUNDS"); do
    for setting in before generic generic+wait; do
        run_hearth "$setting" "$r"
        run_wrk "$setting" "$r"
    done
done >"$tmp/runs"
python3 - "$tmp/runs" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tool, setting, r, cold, init, j = line.split(" ", 5)
    rows.setdefault((tool, setting), []).append((json.loads(j), int(cold), float(init)))
med = statistics.median
print(f"{'client':<7}{'setting':<14}{'inv/s':>8}{'p50 µs':>9}{'p90 µs':>9}{'p99 µs':>10}{'max µs':>10}"
      f"{'cold':>6}{'init sum s':>12}{'mean µs':>10}{'16/rate µs':>12}")
for tool in ("hearth", "wrk"):
    for setting in ("before", "generic", "generic+wait"):
        runs = rows.get((tool, setting), [])
        if not runs:
            continue
        if tool == "hearth":
            get = lambda x, k: x[0]["e2e_us"][k]
            mean = med(x[0]["e2e_us"].get("mean", 0) or 0 for x in runs)
        else:
            get = lambda x, k: x[0][k] or 0
            mean = med(x[0]["mean"] for x in runs)
        rate = med(x[0]["throughput"] for x in runs)
        print(f"{tool:<7}{setting:<14}{rate:>8.0f}{med(get(x, 'p50') for x in runs):>9.0f}"
              f"{med(get(x, 'p90') for x in runs):>9.0f}{med(get(x, 'p99') for x in runs):>10.0f}"
              f"{med(get(x, 'max') for x in runs):>10.0f}{med(x[1] for x in runs):>6.0f}"
              f"{med(x[2] for x in runs):>12.3f}{mean:>10.0f}{16e6 / rate:>12.0f}")
PY
