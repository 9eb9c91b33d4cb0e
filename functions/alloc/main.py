"""alloc: allocates and touches args["mb"] MiB (default 64); used to hit the sandbox memory limit."""

PAGE = 4096


def main(args: dict) -> dict:
    mb = float(args.get("mb", 64))
    size = int(mb * 1024 * 1024)
    block = bytearray(size)
    for off in range(0, size, PAGE):
        block[off] = 1
    del block
    return {"mb": mb}
