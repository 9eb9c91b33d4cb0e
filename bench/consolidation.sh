#!/usr/bin/env bash
# Fine- vs coarse-grained consolidation (measurement study, WoSC '21 §3.1, Figs. 3–4), live: a
# controller with OpenWhisk's balancer (memory slots, home first) in front of up to two `runc`
# worker "nodes" on this machine, each pinned to its own CPU (`runc.cpuset`, and the worker
# process with `taskset`), each with the paper's 2 GiB for sandboxes. One CPU-bound function
# (`busy`, WARM_MS of CPU per call, the paper's Base64) under Poisson arrivals at RATE/s, its
# horizontal concurrency (the number of its sandboxes) C from 2 to 16, at each sandbox size in
# GRAINS (MiB; the first is the fine-grained policy, the paper's 128 MiB):
#   a node holds 2048 ÷ size sandboxes; the C sandboxes fill the first node, then the second
#   (the paper's CG1/CG2); past two nodes (this machine's CPUs, the paper's cluster limit) the
#   second node takes the rest anyway. 128 MiB: one node for every C ≤ 16; 256 MiB: two for C > 8.
# A node's memory budget is its share of the C sandboxes, so OpenWhisk's slots fill exactly when
# its sandboxes are all busy and the next call goes to the other node. Prints, per size and C,
# the mean and p99 end-to-end latency, mean wait and execution, the share of calls on the second
# node and each node's CPU utilization (its sandboxes' CPU time, from cpuacct, over the run),
# then Fig. 4's grid: the fine-grained policy's p99 over each coarser one's. The controller and
# the load generator run on the second node's CPU, so the first node's CPU is its own under
# every policy (the second node shares its CPU with them: a handicap for the coarse policy).
#
#   bench/consolidation.sh [OUT_DIR] [SECONDS]   (default: bench/out/consolidation, 30; root, runc)
# Environment: RATE (8: 80 % of one node's CPU), WARM_MS (100), CONC ("2 4 6 8 10 12 14 16"),
#              GRAINS ("128 256"; e.g. "128 256 512 1024" for all of Fig. 4), NODE_CPUS ("1 0").
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
hearth_bin
out=${1:-bench/out/consolidation}
secs=${2:-30}
RATE=${RATE:-8}
WARM_MS=${WARM_MS:-100}
CONC=${CONC:-2 4 6 8 10 12 14 16}
GRAINS=${GRAINS:-128 256}
read -r CPU1 CPU2 <<<"${NODE_CPUS:-1 0}"
mkdir -p "$out"

bench_scratch_servers

"$H" trace make poisson --rate "$RATE" --duration "${secs}s" --functions 1 --warm-ms "$WARM_MS" \
    --mem-mb 128 --seed 3 -o "$tmp/trace.csv" | sed -n 1p
# Each size's copy of the trace: the call spins WARM_MS of CPU time in a sandbox of that size.
for mem in $GRAINS; do
    cp "$tmp/trace.csv" "$out/m$mem.trace.csv"
    python3 - "$tmp/trace.meta.csv" "$out/m$mem.trace.meta.csv" "$mem" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
for r in rows:
    r["sample"] = "busy"
    r["mem_mb"] = sys.argv[3]
    r["args"] = json.dumps({"ms": float(r["warm_ms"]), "cpu": True}, separators=(",", ":"))
with open(sys.argv[2], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
PY
done

# CPU time (ns) a node's sandboxes used: its workers' cpuacct cgroup (0 before the first sandbox)
sandbox_cpu() {
    cat "/sys/fs/cgroup/cpuacct/hearth/$1/cpuacct.usage" 2>/dev/null || echo 0
}

# node NAME CPU SANDBOXES MEM_MB CONTROLLER_URL: a worker pinned to CPU holding SANDBOXES sandboxes
node() {
    local name=$1 cpu=$2 n=$3 mem=$4 curl=$5 port
    port=$(free_port)
    # No free buffer and no generic pool: the budget is exactly the node's sandboxes.
    HEARTH_LOG=warn HEARTH_WORKER_ID="$name" HEARTH_RUNC__CPUSET="$cpu" \
        HEARTH_FREE_BUFFER_MB=0 HEARTH_GENERIC_POOL=0 \
        HEARTH_CLUSTER_KEY_FILE="$tmp/controller/cluster.key" \
        taskset -c "$cpu" "$H" worker --backend runc --listen "127.0.0.1:$port" \
        --data-dir "$tmp/$name" --controller "$curl" --concurrency "$n" \
        --memory-mb $((n * mem)) >"$tmp/$name.log" 2>&1 &
    pids+=($!)
}

echo "mem,conc,nodes,node1_cpu_ns,node2_cpu_ns,seconds" >"$out/nodes.csv"
for mem in $GRAINS; do
    [ "$mem" -ge 1 ] && [ "$mem" -le 2048 ] || { echo "GRAINS: 1 to 2048 MiB" >&2; exit 2; }
done
# The sizes alternate at each C, so that the machine's noise hits them alike.
for c in $CONC; do
    for mem in $GRAINS; do
        per_node=$((2048 / mem))
        rm -rf "$tmp/controller" "$tmp"/node*
        cport=$(free_port)
        curl_=http://127.0.0.1:$cport
        HEARTH_LOG=warn taskset -c "$CPU2" "$H" controller --listen "127.0.0.1:$cport" --data-dir "$tmp/controller" \
            --balance openwhisk >"$tmp/controller.log" 2>&1 &
        pids+=($!)
        wait_healthy "$curl_"
        wait_file "$tmp/controller/cluster.key" || true
        first=$((c < per_node ? c : per_node))
        nodes=1
        # The first node joins first: OpenWhisk's invoker list is in join order, and the
        # function's home (its hash modulo the list) is then the node that holds 8.
        node node1 "$CPU1" "$first" "$mem" "$curl_"
        wait_workers "$curl_" "$tmp/controller" 1
        if [ "$c" -gt "$first" ]; then
            node node2 "$CPU2" $((c - first)) "$mem" "$curl_"
            nodes=2
            wait_workers "$curl_" "$tmp/controller" 2
        fi
        echo "== $mem MiB, concurrency $c: $nodes node(s)" >&2
        b1=$(sandbox_cpu node1)
        b2=$(sandbox_cpu node2)
        t0=$(date +%s.%N)
        taskset -c "$CPU2" "$H" load trace "$out/m$mem.trace.csv" --url "$curl_" \
            -o "$out/m$mem-c$c.csv" >"$out/m$mem-c$c.load.txt" 2>&1
        t1=$(date +%s.%N)
        echo "$mem,$c,$nodes,$(($(sandbox_cpu node1) - b1)),$(($(sandbox_cpu node2) - b2)),$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
            >>"$out/nodes.csv"
        stop_all
    done
done

python3 - "$out" "$GRAINS" $CONC <<'PY' | tee "$out/summary.md"
import csv, math, sys
out, grains, concs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def pct(v, p):
    v = sorted(v)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)] if v else 0.0
nodes = {(r["mem"], r["conc"]): r for r in csv.DictReader(open(f"{out}/nodes.csv"))}
def cell(mem, c):
    rows = list(csv.DictReader(open(f"{out}/m{mem}-c{c}.csv")))
    ok = [r for r in rows if r["outcome"] == "ok"]
    e2e = [int(r["e2e_us"]) / 1000 for r in ok]
    n = nodes[(mem, c)]
    secs = float(n["seconds"])
    return {
        "mean": sum(e2e) / len(e2e), "p99": pct(e2e, 99),
        "wait": sum(int(r["queue_us"] or 0) for r in ok) / len(ok) / 1000,
        "exec": sum(int(r["exec_us"] or 0) for r in ok) / len(ok) / 1000,
        "on2": sum(1 for r in ok if r["worker"] == "node2") / len(ok),
        "u1": int(n["node1_cpu_ns"]) / 1e9 / secs, "u2": int(n["node2_cpu_ns"]) / 1e9 / secs,
        "failed": len(rows) - len(ok), "nodes": n["nodes"],
    }
fg = grains[0]
for cg in grains[1:]:
    print(f"\nFG {fg} MiB against CG {cg} MiB (a node holds {2048 // int(cg)} CG sandboxes)\n")
    print("| C | FG e2e mean / p99 ms | CG e2e mean / p99 ms | FG ÷ CG mean / p99 | FG wait / exec ms | CG wait / exec ms | CG nodes, calls on node 2 | sandbox CPU: FG node 1 | CG node 1 / node 2 |")
    print("|---:|---|---|---|---|---|---|---:|---|")
    for c in concs:
        f, g = cell(fg, c), cell(cg, c)
        print(f"| {c} | {f['mean']:.0f} / {f['p99']:.0f} | {g['mean']:.0f} / {g['p99']:.0f} "
              f"| {f['mean'] / g['mean']:.2f}× / {f['p99'] / g['p99']:.2f}× "
              f"| {f['wait']:.0f} / {f['exec']:.0f} | {g['wait']:.0f} / {g['exec']:.0f} "
              f"| {g['nodes']}, {g['on2'] * 100:.0f} % | {f['u1'] * 100:.0f} % "
              f"| {g['u1'] * 100:.0f} / {g['u2'] * 100:.0f} % |"
              + (f" failed: FG {f['failed']}, CG {g['failed']}" if f["failed"] or g["failed"] else "")
              + (" (home was node 2)" if g["on2"] > 0.5 else ""))
print(f"\nFig. 4: FG ({fg} MiB) p99 over CG p99 − 1, % (positive: FG worse)\n")
print("| CG size | " + " | ".join(f"C = {c}" for c in concs) + " |")
print("|---|" + "---:|" * len(concs))
for cg in grains[1:]:
    print(f"| {cg} MiB | " + " | ".join(
        f"{(cell(fg, c)['p99'] / cell(cg, c)['p99'] - 1) * 100:+.0f}" for c in concs) + " |")
PY
