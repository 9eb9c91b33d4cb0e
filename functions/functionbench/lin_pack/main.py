"""lin_pack (FunctionBench): LINPACK-style, solves a random dense args["n"] × n system (default
500, at most 3000) with numpy (LAPACK LU), b = A·1 so the exact answer is known. Returns the
normalized residual ‖Ax−b‖ / (n·ε·‖A‖·‖x‖) (LINPACK passes below 16), the largest error of x,
and GFLOP/s by LINPACK's operation count."""

import time

import numpy as np


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def main(args: dict) -> dict:
    n = _int(args, "n", 500, 2, 3000)
    seed = _int(args, "seed", 32, 0, 2**32 - 1)
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) - 0.5
    b = a @ np.ones(n)
    t0 = time.perf_counter()
    x = np.linalg.solve(a, b)
    dt = time.perf_counter() - t0
    eps = np.finfo(np.float64).eps
    resid = np.linalg.norm(a @ x - b, np.inf)
    norm = n * eps * np.linalg.norm(a, np.inf) * np.linalg.norm(x, np.inf)
    flops = 2.0 / 3.0 * n**3 + 2.0 * n**2
    return {
        "n": n,
        "normalized_residual": float(resid / norm),
        "max_error": float(np.max(np.abs(x - 1.0))),
        "gflops": round(flops / max(dt, 1e-9) / 1e9, 3),
        "latency_s": dt,
    }
