"""busy: the synthetic experiment function.

Spins args["ms"] ms (default 10; CPU time of the process if args["cpu"] is true, else wall time) holding args["mb"] MiB (default 0).
"""

from time import perf_counter, process_time

PAGE = 4096


def main(args: dict) -> dict:
    ms = float(args.get("ms", 10))
    mb = float(args.get("mb", 0))
    size = int(mb * 1024 * 1024)
    held = bytearray(size)
    for off in range(0, size, PAGE):  # touch every page so it is really resident
        held[off] = 1
    iterations = 0
    if args.get("cpu") is True:
        # The process CPU clock is a system call (not the vDSO): read it every 256 turns.
        deadline = process_time() + ms / 1000.0
        while process_time() < deadline:
            for _ in range(256):
                iterations += 1
    else:
        deadline = perf_counter() + ms / 1000.0
        while perf_counter() < deadline:
            iterations += 1
    del held
    return {"ms": ms, "mb": mb, "iterations": iterations}
