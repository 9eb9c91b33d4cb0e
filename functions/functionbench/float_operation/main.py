"""float_operation (FunctionBench): math.sin, cos and sqrt of every integer below args["n"]
(default 100000, at most 10 million), summed; returns the sum."""

import math
import time


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def main(args: dict) -> dict:
    n = _int(args, "n", 100_000, 1, 10_000_000)
    t0 = time.perf_counter()
    sin, cos, sqrt = math.sin, math.cos, math.sqrt
    acc = 0.0
    for i in range(n):
        x = float(i)
        acc += sin(x) + cos(x) + sqrt(x)
    return {"n": n, "result": acc, "latency_s": time.perf_counter() - t0}
