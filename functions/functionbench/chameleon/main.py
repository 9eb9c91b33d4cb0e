"""chameleon (FunctionBench): renders a big HTML table with the Chameleon page-template engine,
args["rows"] × args["cols"] cells (defaults 500 × 20, at most 2000 × 200); the template is
compiled once per sandbox, as a web application would. Returns the HTML's size, cell count and
SHA-256."""

import hashlib
import time

from chameleon import PageTemplate

TEMPLATE = """<table xmlns:tal="http://xml.zope.org/namespaces/tal">
<tr tal:repeat="row rows"><td tal:repeat="c row" class="cell" tal:content="c"/></tr>
</table>"""

_template = None


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def main(args: dict) -> dict:
    global _template
    rows = _int(args, "rows", 500, 1, 2000)
    cols = _int(args, "cols", 20, 1, 200)
    t0 = time.perf_counter()
    if _template is None:
        _template = PageTemplate(TEMPLATE)
    data = [[f"r{r}c{c}&" for c in range(cols)] for r in range(rows)]
    html = _template(rows=data)
    return {
        "rows": rows,
        "cols": cols,
        "bytes": len(html),
        "cells": html.count("<td "),
        "sha256": hashlib.sha256(html.encode()).hexdigest(),
        "latency_s": time.perf_counter() - t0,
    }
