# Helpers shared by the bench scripts; `source` it, do not run it.

# A TCP port free on 127.0.0.1 right now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Polls URL/healthz up to 100 times, INTERVAL seconds apart (default 0.1), until it answers.
# Gives up silently: the first request to a server that never came up says what is wrong.
wait_healthy() {
    local url=$1 interval=${2:-0.1}
    for _ in $(seq 100); do
        curl -sf "$url/healthz" >/dev/null 2>&1 && return 0
        sleep "$interval"
    done
    return 0
}

# The operator key a server wrote at its first start in its data directory DIR (a cluster's is in
# DIR/controller); empty for a server without authentication. Scripts export it as
# HEARTH_API_KEY, which `hearth` commands send.
key_of() {
    cat "$1/admin.key" 2>/dev/null || cat "$1/controller/admin.key" 2>/dev/null || true
}

# Waits up to 10 s for FILE to exist (a secret a server writes when it starts).
wait_file() {
    for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done
    return 1
}

# A throw-away directory in $tmp, removed on exit together with the worker whose PID the caller
# keeps in $pid (empty when none runs).
bench_scratch() {
    tmp=$(mktemp -d /tmp/hearth-bench-XXXXXX)
    pid=
    trap 'if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi; rm -rf "$tmp"' EXIT
}

# A throw-away directory in $tmp and an array `pids` of the servers the caller starts (append
# with `pids+=($!)`); `stop_all` stops them, and on exit they are stopped and $tmp removed.
bench_scratch_servers() {
    tmp=$(mktemp -d /tmp/hearth-bench-XXXXXX)
    pids=()
    trap 'stop_all; rm -rf "$tmp"' EXIT
}

# Stops (TERM, then waits for) every server in `pids` and empties it.
stop_all() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}

# Sets $H to the hearth binary ($HEARTH, default the release build); exits if it is not built.
hearth_bin() {
    H=${HEARTH:-target/release/hearth}
    [ -x "$H" ] || { echo "build first: cargo build --release -p hearth-cli" >&2; exit 1; }
}

# Waits up to 20 s until the controller at URL (data directory DIR) has N workers up; exports its
# operator key as HEARTH_API_KEY.
wait_workers() {
    local url=$1 dir=$2 want=$3 n
    for _ in $(seq 200); do
        export HEARTH_API_KEY=$(key_of "$dir")
        n=$(curl -sf -H "Authorization: Bearer $HEARTH_API_KEY" "$url/v1/status" 2>/dev/null |
            python3 -c 'import json,sys; print(sum(1 for w in json.load(sys.stdin)["workers"] if w["up"]))' 2>/dev/null || echo 0)
        [ "$n" = "$want" ] && return 0
        sleep 0.1
    done
}

# One row of `hearth bench overhead --json` output: NAME then inv/s and overhead/e2e percentiles (µs).
overhead_row() {
    python3 - "$1" "$2" <<'PY'
import json, sys
name, j = sys.argv[1], json.loads(sys.argv[2])
o, t = j["overhead_us"], j["e2e_us"]
print(f'{name:<22} {j["throughput"]:>10.0f} {o["p50"]:>8} {o["p90"]:>8} {o["p99"]:>8} {t["p50"]:>8} {t["p99"]:>8}'
      + (f'   errors {j["errors"]}' if j["errors"] else ''))
PY
}

# Registers functions/noop as `noop` on the server at URL and prewarms COUNT sandboxes of it, for
# a third-party client to invoke at URL/v1/functions/noop/invoke. Uses $H and HEARTH_API_KEY.
prewarmed_noop() {
    "$H" fn register noop --url "$1" --code functions/noop >/dev/null
    curl -sf -H "Authorization: Bearer $HEARTH_API_KEY" -H 'Content-Type: application/json' \
        -d "{\"count\": $2}" "$1/v1/functions/noop/prewarm" >/dev/null
}

# Writes FILE: a wrk script that POSTs `{}` as JSON.
wrk_post_script() {
    printf 'wrk.method = "POST"\nwrk.body = "{}"\nwrk.headers["Content-Type"] = "application/json"\n' >"$1"
}
