"""json_dumps_loads (FunctionBench): serializes and parses a generated JSON document of args["n"]
records (default 2000, at most 100000) args["k"] times (default 10, at most 1000); returns the
document's size and the SHA-256 of its last serialization (the same for every k: the round trip
is lossless)."""

import hashlib
import json
import time


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def document(n: int) -> dict:
    """A deterministic document shaped like an API answer: nested records of mixed types."""
    return {
        "count": n,
        "items": [
            {
                "id": i,
                "name": f"item-{i:06d}",
                "price": round(i * 0.37 % 1000, 2),
                "tags": ["t%d" % (i % 7), "t%d" % (i % 11)],
                "active": i % 3 == 0,
                "owner": {"id": i % 97, "email": f"user{i % 97}@example.org"},
            }
            for i in range(n)
        ],
    }


def main(args: dict) -> dict:
    n = _int(args, "n", 2000, 1, 100_000)
    k = _int(args, "k", 10, 1, 1000)
    t0 = time.perf_counter()
    doc = document(n)
    text = ""
    for _ in range(k):
        text = json.dumps(doc)
        doc = json.loads(text)
    return {
        "n": n,
        "k": k,
        "bytes": len(text),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "latency_s": time.perf_counter() - t0,
    }
