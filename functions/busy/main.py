"""busy: the synthetic experiment function.

Spins the CPU for args["ms"] ms (default 10) while holding args["mb"] MiB (default 0) allocated and touched.
"""

from time import perf_counter

PAGE = 4096


def main(args: dict) -> dict:
    ms = float(args.get("ms", 10))
    mb = float(args.get("mb", 0))
    size = int(mb * 1024 * 1024)
    held = bytearray(size)
    for off in range(0, size, PAGE):  # touch every page so it is really resident
        held[off] = 1
    deadline = perf_counter() + ms / 1000.0
    iterations = 0
    while perf_counter() < deadline:
        iterations += 1
    del held
    return {"ms": ms, "mb": mb, "iterations": iterations}
