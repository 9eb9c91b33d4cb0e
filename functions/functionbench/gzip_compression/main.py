"""gzip_compression (FunctionBench): writes a generated file of args["kb"] KiB (default 2048, at
most 32768: /tmp is a small tmpfs) to /tmp, gzips it to a second file, decompresses that and
checks it matches; returns both sizes and the SHA-256 of the original. Both files are removed."""

import gzip
import hashlib
import os
import random
import shutil
import tempfile
import time

WORDS = [
    "serverless", "function", "sandbox", "cold", "warm", "start", "keep", "alive", "memory",
    "worker", "queue", "invoke", "hearth", "latency", "throughput", "python", "runtime", "layer",
]


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def content(size: int) -> bytes:
    """Text-like, compressible bytes (seeded words and numbers), exactly `size` long."""
    rng = random.Random(32)
    parts, n = [], 0
    while n < size:
        line = " ".join(rng.choice(WORDS) for _ in range(12)) + " %d\n" % rng.randrange(10**6)
        parts.append(line)
        n += len(line)
    return "".join(parts).encode()[:size]


def main(args: dict) -> dict:
    size = _int(args, "kb", 2048, 1, 32768) * 1024
    t0 = time.perf_counter()
    data = content(size)
    work = tempfile.mkdtemp(prefix="gzip-")
    try:
        src, dst = os.path.join(work, "data.txt"), os.path.join(work, "data.txt.gz")
        with open(src, "wb") as f:
            f.write(data)
        with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=6) as g:
            shutil.copyfileobj(f, g)
        compressed = os.path.getsize(dst)
        with gzip.open(dst, "rb") as g:
            back = g.read()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if back != data:
        raise RuntimeError("gzip round trip changed the data")
    return {
        "bytes": size,
        "compressed_bytes": compressed,
        "ratio": round(compressed / size, 4),
        "sha256": hashlib.sha256(data).hexdigest(),
        "latency_s": time.perf_counter() - t0,
    }
