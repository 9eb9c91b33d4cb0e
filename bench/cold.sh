#!/usr/bin/env bash
# Cold starts of a hello function on a runc worker, from a ready generic sandbox (the default
# generic pool) and created from nothing (generic_pool = 0), alternating; plus what keeping the
# pool costs: the memory its ready generic sandboxes use (their cgroups' usage) and the idle
# worker's CPU with the pool full.
#
# Usage: bench/cold.sh [ROUNDS] [COLD STARTS PER ROUND]     (default 3 20; needs root and runc)
# Environment: HEARTH (binary, default target/release/hearth).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
ROUNDS=${1:-3}
N=${2:-20}

bench_scratch

run() {
    local pool=$1 r=$2 port dir url
    port=$(free_port); dir="$tmp/$pool-$r"; url="http://127.0.0.1:$port"
    HEARTH_GENERIC_POOL=$pool HEARTH_LOG=warn \
        "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$dir" 2>"$dir.log" &
    pid=$!
    wait_healthy "$url"
    export HEARTH_API_KEY=$(key_of "$dir")
    local mem=0 cpu=0
    if [ "$pool" != 0 ]; then
        # The pool at rest: its floor of one generic sandbox, frozen.
        sleep 2
        mem=$(cat /sys/fs/cgroup/memory/hearth/*/hearth-*/memory.usage_in_bytes 2>/dev/null \
            | awk '{s+=$1} END {printf "%.1f", s/1048576}')
        local t0 t1 hz
        hz=$(getconf CLK_TCK)
        t0=$(awk '{print $14+$15}' "/proc/$pid/stat"); sleep 5
        t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
        cpu=$(python3 -c "print(round(($t1 - $t0) / $hz / 5 * 100, 2))")
    fi
    local j
    j=$("$H" bench cold --url "$url" -n "$N" --json)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=
    echo "$pool $r $mem $cpu $j"
}

echo "# bench cold: $N cold starts of hello per run, runc, $(nproc) CPUs, $ROUNDS rounds"
for r in $(seq "$ROUNDS"); do
    for pool in 4 0; do run "$pool" "$r"; done
done >"$tmp/runs"
python3 - "$tmp/runs" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    pool, r, mem, cpu, j = line.split(" ", 4)
    rows.setdefault(pool, []).append((float(mem), float(cpu), json.loads(j)))
med = statistics.median
print(f"{'worker':<22}{'path':<9}{'init p50':>10}{'init p99':>10}{'e2e p50':>10}{'e2e p99':>10}  (ms, median of runs)")
for pool, name in (("4", "generic_pool = 4"), ("0", "generic_pool = 0")):
    for path in ("generic", "fresh"):
        runs = [j["paths"][path] for _, _, j in rows.get(pool, []) if path in j["paths"]]
        if not runs:
            continue
        v = lambda k, q: med(x[k][q] for x in runs)
        n = sum(x["rounds"] for x in runs)
        print(f"{name:<22}{path:<9}{v('init_ms','p50'):>10.1f}{v('init_ms','p99'):>10.1f}"
              f"{v('e2e_ms','p50'):>10.1f}{v('e2e_ms','p99'):>10.1f}  ({n} cold starts)")
pool = rows.get("4", [])
if pool:
    print(f"pool at rest (1 ready generic sandbox): memory {med(m for m, _, _ in pool):.1f} MiB "
          f"(cgroup usage), idle worker CPU {med(c for _, c, _ in pool):.2f} % of a core")
PY
