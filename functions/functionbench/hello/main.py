"""hello (FunctionBench): the smallest function; greets args["name"] (default "world")."""


def main(args: dict) -> dict:
    name = args.get("name", "world")
    if not isinstance(name, str) or len(name) > 256:
        raise ValueError("name must be a string of at most 256 characters")
    return {"greeting": f"Hello, {name}!"}
