"""matmul (FunctionBench-like): pure-Python n x n matrix multiply (default n=60); returns the trace."""

import random


def main(args: dict) -> dict:
    n = int(args.get("n", 60))
    rng = random.Random(int(args.get("seed", 1)))
    a = [[rng.random() for _ in range(n)] for _ in range(n)]
    b = [[rng.random() for _ in range(n)] for _ in range(n)]
    bt = list(zip(*b))
    c = [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a]
    return {"n": n, "trace": sum(c[i][i] for i in range(n))}
