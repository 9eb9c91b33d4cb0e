#!/usr/bin/env bash
# Cold starts of a numpy + Pillow function on a runc worker (issue 32): per path taken
# (pre-imported, generic, fresh), against the host's own import of the same packages, with
# bytecode cached. The function's requirements.txt goes to the worker's dependency layer; the
# same packages, from the same wheelhouse (scripts/wheelhouse.sh), into a host directory for
# the host import.
#
# Usage: bench/cold-deps.sh [COLD STARTS] [URL]   (default 20; without URL a runc worker is
#        started here: needs root and runc)
# Environment: HEARTH (binary, default target/release/hearth), PYTHON (the runtime's
#   interpreter for the host import, default /usr/bin/python3), PIP (default python3 -m pip).
# Prints the headline ratios: generic-path init / host import (target <= 1.3) and the
# pre-imported init p50 and p99 (targets 15 ms and 40 ms).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
N=${1:-20}
URL=${2:-}
PYTHON=${PYTHON:-/usr/bin/python3}
PIP=${PIP:-python3 -m pip}
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

bench_scratch

fn="$tmp/fn"; site="$tmp/site"
mkdir -p "$fn"
cat >"$fn/requirements.txt" <<'REQ'
numpy
Pillow
REQ
cat >"$fn/main.py" <<'PY'
import numpy as np
from PIL import Image


def main(args):
    n = int(args.get("n", 8))
    img = Image.fromarray(np.arange(n * n, dtype=np.uint8).reshape(n, n))
    return {"size": list(img.size), "sum": int(np.asarray(img).sum())}
PY
# The host's copy: wheels for the runtime's Python, bytecode compiled as a layer's is.
# From the same wheelhouse the worker's build installs from, so both import the same versions.
WHEELHOUSE=${WHEELHOUSE:-/var/cache/hearth/wheelhouse}
$PIP install -q --target "$site" --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --no-index --find-links "$WHEELHOUSE" numpy Pillow
"$PYTHON" -m compileall -q "$site" >/dev/null

if [ -z "$URL" ]; then
    port=$(free_port); dir="$tmp/worker"; URL="http://127.0.0.1:$port"
    HEARTH_LOG=warn "$H" worker --backend runc --listen "127.0.0.1:$port" --data-dir "$dir" \
        2>"$dir.log" &
    pid=$!
    wait_healthy "$URL"
    export HEARTH_API_KEY=$(key_of "$dir")
fi

echo "# bench cold-deps: $N cold starts of a numpy + Pillow function, $(nproc) CPUs"
j=$("$H" bench cold --url "$URL" -n "$N" --code "$fn" --memory 256 \
    --host-import numpy,PIL.Image --host-site "$site" --host-python "$PYTHON" --json)
if [ -n "${pid:-}" ]; then kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=; fi
python3 - "$j" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
paths, host = j["paths"], j.get("host_import_ms", {})
for name in ("preimported", "generic", "fresh"):
    p = paths.get(name)
    if p:
        print(f"{name:<12} ({p['rounds']:>3})  init ms p50 {p['init_ms']['p50']:7.1f} "
              f"p99 {p['init_ms']['p99']:7.1f}   e2e ms p50 {p['e2e_ms']['p50']:7.1f} "
              f"p99 {p['e2e_ms']['p99']:7.1f}")
print(f"host import  ({host.get('runs', 0):>3})  ms p50 {host.get('p50', 0):7.1f} "
      f"p99 {host.get('p99', 0):7.1f}")
ratio = j.get("generic_over_host_import")
print("generic-path init / host import:", ratio if ratio is not None else "n/a (no generic cold start)",
      "(target <= 1.3)")
if j.get("fresh_over_host_import") is not None:
    print("fresh-path init / host import:", j["fresh_over_host_import"], "(sandbox creation included)")
pre = paths.get("preimported")
if pre:
    print(f"pre-imported init p50 {pre['init_ms']['p50']:.1f} ms (target <= 15), "
          f"p99 {pre['init_ms']['p99']:.1f} ms (target <= 40)")
else:
    print("pre-imported: none measured (the worker has no layer for the function, or no pool)")
PY
