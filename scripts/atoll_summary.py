#!/usr/bin/env python3
"""Atoll's metrics (SoCC'21 §7.1) of per-invocation results (`hearth load trace` or `hearth sim`
CSV) against a trace's metadata: % deadlines missed overall and per class, cold starts, p99.9
end-to-end latency. A deadline counts from the scheduled send (the load generator's e2e), as
the platform's entry; an invocation that did not answer 200 counts as missed.

Usage: scripts/atoll_summary.py META.csv LABEL=RESULTS.csv [LABEL=RESULTS.csv ...]
"""
import csv
import math
import sys


def load_meta(path):
    meta = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = row.get("function") or row.get("func_name")
            deadline = row.get("deadline_ms") or ""
            source = row.get("source") or ""
            cls = source.split(":")[1] if source.startswith("atoll:C") else "-"
            meta[name] = (float(deadline) if deadline else None, cls)
    return meta


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    k = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return sorted_values[k]


def summarize(meta, path):
    total = missed = cold = 0
    per_class = {}
    e2e = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            total += 1
            deadline, cls = meta.get(row["function"], (None, "-"))
            ms = int(row["e2e_us"]) / 1000.0
            ok = row["outcome"] == "ok"
            late = (not ok) or (deadline is not None and ms > deadline)
            missed += late
            cold += row["cold"] in ("true", "1")
            c = per_class.setdefault(cls, [0, 0])
            c[0] += 1
            c[1] += late
            if ok:
                e2e.append(ms)
    e2e.sort()
    return {
        "invocations": total,
        "missed_pct": 100.0 * missed / max(total, 1),
        "cold": cold,
        "p99.9_ms": percentile(e2e, 99.9),
        "classes": {k: 100.0 * v[1] / max(v[0], 1) for k, v in sorted(per_class.items())},
    }


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    meta = load_meta(argv[1])
    rows = []
    for arg in argv[2:]:
        label, _, path = arg.partition("=")
        rows.append((label, summarize(meta, path)))
    classes = sorted({c for _, r in rows for c in r["classes"]})
    head = f"{'run':<16} {'calls':>7} {'missed %':>9} {'cold':>6} {'p99.9 ms':>9}"
    head += "".join(f" {c + ' %':>8}" for c in classes)
    print(head)
    for label, r in rows:
        line = f"{label:<16} {r['invocations']:>7} {r['missed_pct']:>9.2f} {r['cold']:>6} {r['p99.9_ms']:>9.1f}"
        line += "".join(f" {r['classes'].get(c, 0.0):>8.2f}" for c in classes)
        print(line)


if __name__ == "__main__":
    main(sys.argv)
