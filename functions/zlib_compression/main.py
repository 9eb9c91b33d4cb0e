"""zlib_compression (FunctionBench-like): compresses and decompresses args["size"] bytes
(default 256 KiB) of generated, moderately compressible data."""

import random
import zlib


def main(args: dict) -> dict:
    size = int(args.get("size", 256 * 1024))
    rng = random.Random(int(args.get("seed", 42)))
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(512)]
    chunks, total = [], 0
    while total < size:
        w = words[rng.randrange(512)]
        chunks.append(w)
        chunks.append(b" ")
        total += len(w) + 1
    data = b"".join(chunks)[:size]
    compressed = zlib.compress(data, int(args.get("level", 6)))
    restored = zlib.decompress(compressed)
    if restored != data:
        raise RuntimeError("zlib round trip mismatch")
    return {"size": size, "compressed": len(compressed), "ratio": round(len(compressed) / max(size, 1), 4)}
