"""hello: greets args["name"] (default "world")."""


def main(args: dict) -> dict:
    return {"greeting": f"Hello, {args.get('name', 'world')}!"}
