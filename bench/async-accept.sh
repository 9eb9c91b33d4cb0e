#!/usr/bin/env bash
# Async accept latency: how long `POST …/invoke?async=true` takes to answer 202, which it does
# only once the invocation is stored durably. Four setups, each with a sim worker:
#   worker alone (SQLite async.db) · controller with SQLite · controller with a 1-member etcd ·
#   controller with a 3-member etcd (all on loopback, etcd with its default fsync).
# `hearth bench async` sends N sequential accepts (after 100 unmeasured ones) from one client.
#
# Usage: bench/async-accept.sh [N] [ROUNDS]     (defaults: 2000, 3; medians over the rounds)
# Environment: HEARTH (binary, default target/release/hearth).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
N=${1:-2000}
ROUNDS=${2:-3}
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 1; }

bench_scratch_servers

# etcd with MEMBERS members in DIR; prints the store URL.
start_etcd() {
    local members=$1 dir=$2 initial="" urls="" i
    local -a cports pports
    for i in $(seq 0 $((members - 1))); do
        cports[$i]=$(free_port); pports[$i]=$(free_port)
        initial+="${initial:+,}e$i=http://127.0.0.1:${pports[$i]}"
        urls+="${urls:+,}127.0.0.1:${cports[$i]}"
    done
    for i in $(seq 0 $((members - 1))); do
        etcd --name "e$i" --data-dir "$dir/e$i" \
            --listen-client-urls "http://127.0.0.1:${cports[$i]}" \
            --advertise-client-urls "http://127.0.0.1:${cports[$i]}" \
            --listen-peer-urls "http://127.0.0.1:${pports[$i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${pports[$i]}" \
            --initial-cluster "$initial" --initial-cluster-state new \
            --initial-cluster-token "bench-$$-$members" >"$dir/e$i.log" 2>&1 &
        pids+=($!)
    done
    for _ in $(seq 100); do
        ETCDCTL_API=3 etcdctl --endpoints "$urls" put /bench/ready 1 >/dev/null 2>&1 && break
        sleep 0.1
    done
    echo "etcd://$urls"
}

# One setup: prints the JSON of `hearth bench async` against it.
run_case() {
    local kind=$1 dir="$tmp/$1-$2" url store
    mkdir -p "$dir"
    local wport cport
    wport=$(free_port); cport=$(free_port)
    case $kind in
    worker)
        "$H" worker --backend sim --listen "127.0.0.1:$wport" --data-dir "$dir/w" >"$dir/w.log" 2>&1 &
        pids+=($!)
        url="http://127.0.0.1:$wport"; wait_healthy "$url"
        export HEARTH_API_KEY=$(key_of "$dir/w")
        ;;
    sqlite|etcd1|etcd3)
        case $kind in
        sqlite) store=sqlite ;;
        etcd1) store=$(start_etcd 1 "$dir") ;;
        etcd3) store=$(start_etcd 3 "$dir") ;;
        esac
        "$H" controller --store "$store" --balance ch --listen "127.0.0.1:$cport" \
            --data-dir "$dir/c" >"$dir/c.log" 2>&1 &
        pids+=($!)
        url="http://127.0.0.1:$cport"; wait_healthy "$url"
        wait_file "$dir/c/cluster.key"
        if [ "$kind" = sqlite ]; then
            HEARTH_CLUSTER_KEY_FILE="$dir/c/cluster.key" HEARTH_STATUS_INTERVAL_MS=100 \
                "$H" worker --backend sim --controller "$url" --listen "127.0.0.1:$wport" \
                --data-dir "$dir/w" >"$dir/w.log" 2>&1 &
        else
            HEARTH_CLUSTER_KEY_FILE="$dir/c/cluster.key" \
                "$H" worker --backend sim --store "$store" --listen "127.0.0.1:$wport" \
                --data-dir "$dir/w" >"$dir/w.log" 2>&1 &
        fi
        pids+=($!)
        export HEARTH_API_KEY=$(key_of "$dir/c")
        for _ in $(seq 100); do
            curl -sf -H "Authorization: Bearer $HEARTH_API_KEY" "$url/v1/status" \
                | grep -q '"workers_up":1' && break
            sleep 0.1
        done
        ;;
    esac
    "$H" bench async --url "$url" -n "$N" --json
    stop_all
}

echo "# async accept latency: $N sequential accepts per run, $ROUNDS rounds, $(nproc) CPUs"
printf '%-26s %9s %9s %9s %9s\n' setup "p50 µs" "p90 µs" "p99 µs" "mean µs"
for kind in worker sqlite etcd1 etcd3; do
    runs=()
    for r in $(seq "$ROUNDS"); do runs+=("$(run_case "$kind" "$r")"); done
    python3 - "$kind" "${runs[@]}" <<'PY'
import json, statistics, sys
kind, runs = sys.argv[1], [json.loads(r) for r in sys.argv[2:]]
name = {"worker": "worker alone (SQLite)", "sqlite": "controller, SQLite",
        "etcd1": "controller, etcd x1", "etcd3": "controller, etcd x3"}[kind]
m = lambda k: statistics.median(r["accept_us"][k] for r in runs)
errors = sum(r["errors"] for r in runs)
print(f"{name:<26} {m('p50'):>9.0f} {m('p90'):>9.0f} {m('p99'):>9.0f} {m('mean'):>9.0f}"
      + (f"   ({errors} errors)" if errors else ""))
PY
done
