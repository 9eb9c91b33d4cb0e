#!/usr/bin/env bash
# CPU interference at cpu.shares ratios (measurement study, WoSC '21 §3.2, Fig. 6's CPU part):
# a short CPU-bound function (`victim`, 20 ms of CPU, 256 MiB) in a closed loop, alone and beside
# two CPU hogs (1 s of CPU per call, in a closed loop each) whose memory, and so whose CPU share
# with `runc.cpu_shares_per_gb`, is 1, 2 and 4 times the victim's (the paper's C1-C3: 1:1, 1:2,
# 1:4). Runs once with the kernel's default weight for every sandbox (`default`) and once with
# CPU in proportion to memory (`shares`, 1024 per GiB, as OpenWhisk allocates). Prints the
# victim's end-to-end p50 / p99 normalized to running alone.
#
#   bench/interference.sh [OUT_DIR] [SECONDS]   (default: bench/out/interference, 15; root, runc)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
out=${1:-bench/out/interference}
secs=${2:-15}
mkdir -p "$out"
bench_scratch

victim_args='{"ms":20,"cpu":true}'
hog_args='{"ms":1000,"cpu":true}'
meta="$out/functions.meta.csv"
{
    echo 'function,warm_ms,cold_ms,mem_mb,sample,args,source'
    echo 'victim,20,250,256,busy,"{""ms"":20,""cpu"":true}",interference'
    for m in 256 512 1024; do
        echo "hog-$m,1000,250,$m,busy,\"{\"\"ms\"\":1000,\"\"cpu\"\":true}\",interference"
    done
} >"$meta"

for mode in default shares; do
    per_gb=0
    [ "$mode" = shares ] && per_gb=1024
    port=$(free_port)
    data="$tmp/$mode"
    mkdir -p "$data"
    HEARTH_RUNC__CPU_SHARES_PER_GB=$per_gb HEARTH_LOG=warn "$H" worker --backend runc \
        --listen "127.0.0.1:$port" --data-dir "$data" --concurrency 8 --memory-mb 8192 \
        >"$data.log" 2>&1 &
    pid=$!
    wait_healthy "http://127.0.0.1:$port"
    export HEARTH_API_KEY=$(key_of "$data")
    url="http://127.0.0.1:$port"
    # Registers every function and warms a sandbox of each (results thrown away).
    "$H" load closed --url "$url" --meta "$meta" --function victim,hog-256,hog-512,hog-1024 \
        --clients 2 --duration 3s -o "$tmp/warm.csv" >/dev/null 2>&1
    echo "== $mode: alone" >&2
    "$H" load closed --url "$url" --function victim --data "$victim_args" --clients 1 \
        --duration "${secs}s" -o "$out/$mode-alone.csv" >/dev/null 2>&1
    for m in 256 512 1024; do
        echo "== $mode: beside hog-$m" >&2
        "$H" load closed --url "$url" --function "hog-$m" --data "$hog_args" --clients 2 \
            --duration "$((secs + 3))s" -o "$tmp/hog.csv" >/dev/null 2>&1 &
        hog=$!
        sleep 2
        "$H" load closed --url "$url" --function victim --data "$victim_args" --clients 1 \
            --duration "${secs}s" -o "$out/$mode-hog-$m.csv" >/dev/null 2>&1
        wait "$hog"
    done
    kill -TERM "$pid"
    wait "$pid" || true
    pid=
done

python3 - "$out" <<'PY' | tee "$out/summary.md"
import csv, math, sys
out = sys.argv[1]
def pct(v, p):
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)]
def load(path):
    e = sorted(int(r["e2e_us"]) / 1000 for r in csv.DictReader(open(path)) if r["outcome"] == "ok")
    return pct(e, 50), pct(e, 99), len(e)
print("| sandboxes' weights | victim alone p50 / p99 ms | beside 1:1 | beside 1:2 | beside 1:4 |")
print("|---|---|---|---|---|")
for mode in ("default", "shares"):
    a50, a99, n = load(f"{out}/{mode}-alone.csv")
    cells = []
    for m in (256, 512, 1024):
        p50, p99, _ = load(f"{out}/{mode}-hog-{m}.csv")
        cells.append(f"{p50 / a50:.2f}× / {p99 / a99:.2f}×")
    print(f"| {mode} | {a50:.1f} / {a99:.1f} ({n} calls) | " + " | ".join(cells) + " |")
print("\nbeside: the victim's p50 / p99 end-to-end latency over its own alone; ratio = victim : each hog's memory (and CPU share under `shares`)")
PY
