"""float_operation (FunctionBench-like): math.sin/cos/sqrt over args["n"] iterations (default 100000)."""

import math


def main(args: dict) -> dict:
    n = int(args.get("n", 100000))
    sin, cos, sqrt = math.sin, math.cos, math.sqrt
    acc = 0.0
    for i in range(n):
        x = float(i)
        acc += sin(x) + cos(x) + sqrt(x)
    return {"n": n, "result": acc}
