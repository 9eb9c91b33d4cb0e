"""sleep: sleeps args["ms"] milliseconds (default 100) without using the CPU."""

import time


def main(args: dict) -> dict:
    ms = float(args.get("ms", 100))
    time.sleep(ms / 1000.0)
    return {"slept_ms": ms}
