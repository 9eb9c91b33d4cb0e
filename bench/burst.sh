#!/usr/bin/env bash
# A burst that finds too few warm sandboxes (issue 13): a runc worker with concurrency 16, the
# no-op function prewarmed with 4 sandboxes, then 16 closed-loop clients for 4 s. Prints the
# client-side latency (p50, p90, p99, max), the cold starts and the sum of their init times,
# with the creation cap on (the default: one creation per CPU) and off, alternating.
#
# Usage: bench/burst.sh [ROUNDS]      (default 3; needs root and runc)
# Environment: HEARTH (binary, default target/release/hearth).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
H=${HEARTH:-target/release/hearth}
ROUNDS=${1:-3}
[ -x "$H" ] || { echo "build first: cargo build --release -p hearth-cli" >&2; exit 1; }

tmp=$(mktemp -d /tmp/hearth-bench-XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
    rm -rf "$tmp"
}
trap cleanup EXIT

run() {
    local cap=$1 r=$2 port dir
    port=$(free_port); dir="$tmp/$cap-$r"
    HEARTH_CONCURRENCY=16 HEARTH_MAX_CONCURRENT_CREATIONS=$cap HEARTH_LOG=warn \
        "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$dir" 2>"$dir.log" &
    pid=$!
    wait_healthy "http://127.0.0.1:$port"
    export HEARTH_API_KEY=$(key_of "$dir")
    local j m
    j=$("$H" bench overhead --url "http://127.0.0.1:$port" --clients 16 --prewarm 4 \
        --duration 4s --warmup 0s --json)
    m=$(curl -sf -H "Authorization: Bearer $HEARTH_API_KEY" "http://127.0.0.1:$port/metrics" \
        | grep -E '^hearth_invocation_init_seconds_(sum|count)' | tr '\n' ' ')
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
    echo "$cap $r $j $m"
}

echo "# burst: 16 clients, 4 prewarmed, 4 s, runc, $(nproc) CPUs, $ROUNDS rounds"
for r in $(seq "$ROUNDS"); do
    for cap in 0 1024; do run "$cap" "$r"; done
done >"$tmp/runs"
python3 - "$tmp/runs" <<'PY'
import json, re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    cap, r, rest = line.split(" ", 2)
    j, _, m = rest.partition("} ")
    j = json.loads(j + "}")
    s = re.search(r"_sum(?:\{[^}]*\})? ([0-9.e+-]+)", m)
    c = re.search(r"_count(?:\{[^}]*\})? ([0-9.e+-]+)", m)
    rows.setdefault(cap, []).append((j, float(s.group(1)) if s else 0.0, float(c.group(1)) if c else 0.0))
print(f"{'creation cap':<16}{'inv/s':>8}{'p50 µs':>9}{'p90 µs':>9}{'p99 µs':>10}{'max µs':>10}{'cold':>6}{'init sum s':>12}")
for cap, name in (("0", "on (CPUs)"), ("1024", "off")):
    runs = rows.get(cap, [])
    if not runs:
        continue
    med = lambda f: statistics.median(f(x) for x in runs)
    print(f"{name:<16}{med(lambda x: x[0]['throughput']):>8.0f}{med(lambda x: x[0]['e2e_us']['p50']):>9.0f}"
          f"{med(lambda x: x[0]['e2e_us']['p90']):>9.0f}{med(lambda x: x[0]['e2e_us']['p99']):>10.0f}"
          f"{med(lambda x: x[0]['e2e_us']['max']):>10.0f}{med(lambda x: x[2]):>6.0f}{med(lambda x: x[1]):>12.2f}")
PY
