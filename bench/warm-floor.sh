#!/usr/bin/env bash
# How far the worker's warm path is from its floor on this host.
#
# The floor (crates/worker/examples/warm_floor.rs) is hyper on one runtime thread handing each
# request to one of 4 agents (the real runtime/python/hearth_agent.py running functions/noop,
# over the real two-socket connection, each agent in a cpu,cpuacct cgroup of its own) and
# answering what the agent said: what a warm invocation cannot do without, and none of what the
# worker adds (routing, authentication, the engine, keep-alive, the regulator, metrics,
# timeouts, the sandbox). Both are driven by the same client, `wrk` with one thread and 4
# connections (a closed loop of 4), alternating, ROUNDS times, on a worker with 4 prewarmed
# sandboxes of the noop function and concurrency 16. "bare" is the floor with the least a Python
# agent can be (one read, one write, no handler) instead of Hearth's. Prints req/s and wrk's p50
# for each, and the worker's share of the floor.
#
# Usage: bench/warm-floor.sh [ROUNDS] [SECONDS]     (default 5 5; needs root, runc and wrk)
# Environment: HEARTH (binary, default target/release/hearth).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ROUNDS=${1:-5}
SECS=${2:-5}
hearth_bin
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
cargo build --release -q -p hearth-worker --example warm_floor
F=target/release/examples/warm_floor
bench_scratch
wrk_post_script "$tmp/post.lua"

# wrk against URL (extra arguments are wrk's): "req/s p50_us".
load() {
    local url=$1; shift
    wrk -t1 -c4 -d1s -s "$tmp/post.lua" "$@" "$url" >/dev/null  # warm the connections
    wrk -t1 -c4 -d"${SECS}s" --latency -s "$tmp/post.lua" "$@" "$url" | python3 -c '
import re, sys
out = sys.stdin.read()
def us(v, unit):
    return float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
print("%.0f %.0f" % (rps, us(*p50.groups())))'
}

# run_floor NAME [--bare]
run_floor() {
    local port name=$1; shift
    port=$(free_port)
    "$F" --listen "127.0.0.1:$port" --agents 4 --code functions/noop --cgroups "$@" \
        >"$tmp/floor.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do grep -q listening "$tmp/floor.log" && break; sleep 0.1; done
    echo "$name $(load "http://127.0.0.1:$port/")"
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
}

run_worker() {
    local port dir url
    port=$(free_port); dir="$tmp/w-$1"; url="http://127.0.0.1:$port"
    HEARTH_CONCURRENCY=16 HEARTH_GENERIC_POOL=0 HEARTH_LOG=warn \
        "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$dir" 2>"$dir.log" &
    pid=$!
    wait_healthy "$url"
    export HEARTH_API_KEY=$(key_of "$dir")
    prewarmed_noop "$url" 4
    echo "worker $(load "$url/v1/functions/noop/invoke" -H "Authorization: Bearer $HEARTH_API_KEY")"
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
}

for r in $(seq "$ROUNDS"); do
    run_floor floor
    run_floor bare --bare
    run_worker "$r"
done >"$tmp/runs"
python3 - "$tmp/runs" "$ROUNDS" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, rps, p50 = line.split()
    runs.setdefault(name, []).append((float(rps), float(p50)))
med = statistics.median
print(f"# warm no-op, wrk -t1 -c4, medians of {sys.argv[2]} alternating runs (range)")
print(f"{'server':<8}{'req/s':>9}{'range':>16}{'p50 µs':>8}")
for name, v in runs.items():
    r = [x[0] for x in v]
    print(f"{name:<8}{med(r):>9.0f}{min(r):>8.0f}–{max(r):<7.0f}{med(x[1] for x in v):>8.0f}")
f, w = med(x[0] for x in runs["floor"]), med(x[0] for x in runs["worker"])
print(f"worker / floor: {w / f:.2f}")
PY
