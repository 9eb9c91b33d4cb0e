#!/usr/bin/env bash
# FunctionBench, live: each function of functions/functionbench/ on a running Hearth, warm and
# cold, beside Ilúvatar's numbers for the same functions on its own testbed
# (../shared/traces/iluvatar-paper-repro/worker_function_benchmarks.json). Prints a markdown table
# for bench/RESULTS.md: warm exec p50, warm overhead p50 (`timing.overhead`, and the client's time
# minus exec, Ilúvatar's definition), cold init p50, cold overhead p50, Ilúvatar's medians and the
# ratios Hearth/Ilúvatar.
#
# Usage: bench/functionbench.sh [N] [FUNCTION…]   (default 10 warm and 10 cold invocations each)
# Environment: HEARTH_URL (default http://127.0.0.1:7878), HEARTH_API_KEY or HEARTH_KEY (default
# the operator key a local `hearth up` wrote, ~/.local/share/hearth/admin.key), HEARTH (the CLI,
# default target/release/hearth), OUT (also save the raw results as JSON there).
# Needs a Hearth that installs requirements.txt as dependency layers, and the wheelhouse it was
# configured with (scripts/wheelhouse.sh). Functions it registers are named fb-<random>-NAME and
# deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
N=${1:-10}
shift || true
URL=${HEARTH_URL:-http://127.0.0.1:7878}

if ! curl -sf -o /dev/null --max-time 5 "$URL/healthz"; then
    echo "functionbench: no Hearth at $URL (HEARTH_URL): start one (hearth up) and run again" >&2
    exit 1
fi
if [ -z "${HEARTH_API_KEY:-}" ] && [ -n "${HEARTH_KEY:-}" ]; then export HEARTH_API_KEY=$HEARTH_KEY; fi

echo "# FunctionBench: $N warm + $N cold invocations per function, $URL, $(nproc) CPUs, $(date -u +%FT%TZ)"
only=()
[ $# -gt 0 ] && only=(--only "$@")
python3 bench/functionbench.py run --n "$N" --url "$URL" --hearth "$H" \
    ${OUT:+--out "$OUT"} "${only[@]}"
