"""json_dumps_loads (FunctionBench-like): builds a nested dict of args["n"] entries (default 200)
and serializes/parses it args["k"] times (default 20)."""

import json


def main(args: dict) -> dict:
    n = int(args.get("n", 200))
    k = int(args.get("k", 20))
    doc = {
        "key%d" % i: {"id": i, "name": "item-%d" % i, "tags": ["a", "b", str(i)], "score": i * 0.5}
        for i in range(n)
    }
    size = 0
    for _ in range(k):
        text = json.dumps(doc)
        doc = json.loads(text)
        size = len(text)
    return {"n": n, "k": k, "bytes": size}
