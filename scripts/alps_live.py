#!/usr/bin/env python3
"""ALPS's live comparison (issue 15): a Huawei-like trace of CPU-bound `busy` calls for one
worker, and its summary by duration group.

  alps_live.py make --cpus 2 --load 0.8 --duration 60 --seed 1 -o trace.csv
      Poisson arrivals of seven `busy` functions in ALPS Table 1's Huawei duration groups
      (0–50, 50–200, 200–400, ≥400 ms; 69.8 / 23.2 / 6.0 / 1.0 % of invocations), at a rate
      that offers LOAD × CPUS of CPU work. Each call spins its ms of *CPU time* (`"cpu": true`),
      so a call that gets less CPU takes longer, as under the paper's benchmark functions.
      Writes TRACE and TRACE.meta.csv (the format of `hearth trace make`).
  alps_live.py summary --skip-s 15 LABEL=RESULTS.csv [...]
      Mean and p99 execution duration (the answer's exec time, ALPS's metric) per group, and
      cold starts, of each results file (`hearth load trace` or `hearth sim`), leaving out the
      calls scheduled in the first SKIP seconds (the worker learning and warming up).
"""
import argparse
import csv
import json
import math
import random
import sys

# (name, CPU ms): three functions in G1, two in G2, one each in G3 and G4.
FUNCTIONS = [
    ("g1-10", 10.0),
    ("g1-25", 25.0),
    ("g1-40", 40.0),
    ("g2-80", 80.0),
    ("g2-150", 150.0),
    ("g3-300", 300.0),
    ("g4-600", 600.0),
]
GROUP_SHARES = {"g1": 0.698, "g2": 0.232, "g3": 0.060, "g4": 0.010}
GROUPS = [("G1 0-50", 0, 50), ("G2 50-200", 50, 200), ("G3 200-400", 200, 400), ("G4 >=400", 400, 1e18)]
COLD_MS = 250.0
MEM_MB = 128.0


def shares():
    """Each function's share of invocations: its group's share split evenly in the group."""
    per_group = {}
    for name, _ in FUNCTIONS:
        per_group[name[:2]] = per_group.get(name[:2], 0) + 1
    return [GROUP_SHARES[n[:2]] / per_group[n[:2]] for n, _ in FUNCTIONS]


def make(a):
    if not (0.05 <= a.load <= 2.0):
        sys.exit("--load must be within 0.05-2.0")
    if not (1 <= a.duration <= 3600):
        sys.exit("--duration must be within 1-3600 s")
    w = shares()
    mean_ms = sum(s * ms for s, (_, ms) in zip(w, FUNCTIONS))
    rate = a.load * a.cpus * 1000.0 / mean_ms
    rng = random.Random(a.seed)
    t = 0.0
    rows = []
    while True:
        t += rng.expovariate(rate)
        if t >= a.duration:
            break
        name = rng.choices([n for n, _ in FUNCTIONS], weights=w)[0]
        rows.append((t * 1000.0, name))
    with open(a.out, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["time_ms", "function"])
        for ms, name in rows:
            out.writerow([f"{ms:.3f}", name])
    meta = a.out[:-4] + ".meta.csv" if a.out.endswith(".csv") else a.out + ".meta.csv"
    with open(meta, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["function", "warm_ms", "cold_ms", "mem_mb", "sample", "args", "source"])
        for name, ms in FUNCTIONS:
            args = json.dumps({"ms": ms, "cpu": True}, separators=(",", ":"))
            out.writerow([name, ms, COLD_MS, MEM_MB, "busy", args, "alps:huawei-like"])
    print(
        f"{len(rows)} invocations over {a.duration} s ({rate:.1f}/s, mean work {mean_ms:.1f} ms): "
        f"{a.load * 100:.0f} % of {a.cpus} CPUs"
    )


def percentile(values, p):
    if not values:
        return float("nan")
    k = max(0, math.ceil(p / 100.0 * len(values)) - 1)
    return values[k]


def work_of(name):
    for n, ms in FUNCTIONS:
        if n == name:
            return ms
    return None


def summarize(path, skip_us):
    groups = {g[0]: [] for g in GROUPS}
    every = []
    cold = errors = 0
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["scheduled_us"]) < skip_us:
                continue
            if row["outcome"] != "ok":
                errors += 1
                continue
            work = work_of(row["function"])
            if work is None:
                continue
            ms = int(row["exec_us"]) / 1000.0
            every.append(ms)
            cold += row["cold"] == "true"
            for label, lo, hi in GROUPS:
                if lo <= work < hi:
                    groups[label].append(ms)
    cells = []
    for values in [every] + [groups[g[0]] for g in GROUPS]:
        values.sort()
        mean = sum(values) / len(values) if values else float("nan")
        cells.append(f"{mean:,.1f} / {percentile(values, 99):,.0f}")
    return cells, len(every), cold, errors


def summary(a):
    head = ["run", "all"] + [g[0] for g in GROUPS] + ["calls", "cold", "errors"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for arg in a.runs:
        label, _, path = arg.partition("=")
        cells, n, cold, errors = summarize(path, int(a.skip_s * 1e6))
        print(f"| {label} | " + " | ".join(cells) + f" | {n} | {cold} | {errors} |")
    print("\nmean / p99 execution duration, ms")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--cpus", type=int, default=2)
    m.add_argument("--load", type=float, required=True)
    m.add_argument("--duration", type=float, default=60.0)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("-o", "--out", required=True)
    s = sub.add_parser("summary")
    s.add_argument("--skip-s", type=float, default=15.0)
    s.add_argument("runs", nargs="+")
    a = p.parse_args()
    make(a) if a.cmd == "make" else summary(a)


if __name__ == "__main__":
    main()
