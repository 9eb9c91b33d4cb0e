"""noop: does nothing; measures the pure control-plane and agent overhead."""


def main(args: dict) -> dict:
    return {}
