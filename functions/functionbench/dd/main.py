"""dd (FunctionBench): `dd`-style disk I/O on /tmp (a tmpfs in the sandbox, so its pages count
against the sandbox's memory): writes args["count"] blocks of args["bs"] bytes (defaults 4096 ×
4096 = 16 MiB; bs 512 B – 1 MiB, at most 32 MiB in all), fsyncs, reads them back and removes the
file. Returns the sizes, the SHA-256 of what was read, and MB/s each way."""

import hashlib
import os
import tempfile
import time

MAX_TOTAL = 32 << 20


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def block(bs: int) -> bytes:
    """The block written every time: bytes 0..255 repeated (dd if=/dev/zero would hide misreads)."""
    return (bytes(range(256)) * (bs // 256 + 1))[:bs]


def main(args: dict) -> dict:
    bs = _int(args, "bs", 4096, 512, 1 << 20)
    count = _int(args, "count", 4096, 1, MAX_TOTAL // bs)
    buf = block(bs)
    fd, path = tempfile.mkstemp(prefix="dd-")
    try:
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb", buffering=0) as f:
            for _ in range(count):
                f.write(buf)
            os.fsync(f.fileno())
        t1 = time.perf_counter()
        digest, read = hashlib.sha256(), 0
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(bs):
                digest.update(chunk)
                read += len(chunk)
        t2 = time.perf_counter()
    finally:
        os.unlink(path)
    total = bs * count
    return {
        "bs": bs,
        "count": count,
        "written": total,
        "read": read,
        "sha256": digest.hexdigest(),
        "write_mb_s": round(total / 1e6 / max(t1 - t0, 1e-9), 1),
        "read_mb_s": round(read / 1e6 / max(t2 - t1, 1e-9), 1),
        "latency_s": t2 - t0,
    }
