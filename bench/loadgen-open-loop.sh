#!/usr/bin/env bash
# Open-loop schedule keeping: replays a Poisson trace at RATE invocations/s of a no-op function
# against a sim worker on 127.0.0.1 and prints the send lag (actual − scheduled send time).
# Usage: bench/loadgen-open-loop.sh [RATE=2000] [SECONDS=20] [RUNS=3]   (after cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
RATE=${1:-2000}
SECONDS_=${2:-20}
RUNS=${3:-3}
hearth_bin
work=$(mktemp -d /tmp/hearth-bench-loadgen.XXXXXX)
port=$(free_port)
HEARTH_LOG=warn "$H" worker --listen "127.0.0.1:$port" --backend sim --data-dir "$work/data" 2>"$work/worker.log" &
worker=$!
trap 'kill "$worker" 2>/dev/null; wait "$worker" 2>/dev/null; rm -rf "$work"' EXIT
wait_healthy "http://127.0.0.1:$port" 0.05
export HEARTH_API_KEY=$(key_of "$work/data")
# A no-op: the sim backend answers at once (warm and cold time 0).
"$H" trace make poisson --rate "$RATE" --duration "${SECONDS_}s" --functions 1 --warm-ms 0 \
    --cold-ms 0 --mem-mb 64 --seed 1 -o "$work/trace.csv" >/dev/null
echo "open loop: Poisson ${RATE}/s for ${SECONDS_} s of a no-op, sim worker on 127.0.0.1, $(nproc) cores"
for run in $(seq "$RUNS"); do
    "$H" load trace "$work/trace.csv" --url "http://127.0.0.1:$port" --prewarm \
        -o "$work/run$run.csv" >/dev/null 2>"$work/run$run.err" || { cat "$work/run$run.err" >&2; exit 1; }
    python3 - "$work/run$run.summary.json" "$run" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
lag, e2e = s["send_lag_ms"], s["e2e_ms"]
print(f"run {sys.argv[2]}: {s['invocations']} invocations, offered {s['offered_rate']:.0f}/s, "
      f"answered {s['ok']}; send lag ms p50 {lag['p50']:.3f} p99 {lag['p99']:.3f} max {lag['max']:.3f}; "
      f"late (>1 ms) {s['late_sends']}; e2e ms p50 {e2e['p50']:.3f} p99 {e2e['p99']:.3f}; "
      f"connections {s['connections']['opened']}")
PY
done
