#!/usr/bin/env python3
"""FunctionBench on a running Hearth, beside Ilúvatar's numbers (bench/functionbench.sh runs it).

  functionbench.py iluvatar [--json FILE]           Ilúvatar's medians per function, as a table
  functionbench.py run --n N [--url URL] [--hearth BIN] [--out FILE]
                                                    measure on Hearth, save raw JSON, print the table
  functionbench.py table RESULTS.json               the table again from saved results

`run` registers each function of functions/functionbench/ (`hearth fn register … --wait` when the
CLI has it, then waits for `state` to be final when the API reports one), invokes it once to make
it warm, then N times warm; for cold starts it registers N fresh copies (`NAME-cK`, same code, so
the same dependency layer) and invokes each once. All copies are deleted at the end.

Overheads, as Ilúvatar defines its own (`*_over_results_us` = invocation duration measured by the
client − the function's own time): `client − exec` here is the client's time for the HTTP call
(persistent connection, loopback) minus `timing.exec`; `timing.overhead` is Hearth's
control-plane share alone (e2e − queue − init − exec, measured in the worker). Standard library
only.
"""

import argparse
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FB = os.path.join(ROOT, "functions", "functionbench")
ILUVATAR = os.path.join(
    os.path.dirname(ROOT), "shared", "traces", "iluvatar-paper-repro", "worker_function_benchmarks.json"
)
MAX_N = 1000


class BenchError(Exception):
    """A failure the user can act on; printed without a traceback."""


def manifest() -> dict:
    with open(os.path.join(FB, "functions.json")) as f:
        return json.load(f)


def median(xs):
    return statistics.median(xs) if xs else None


def iluvatar_medians(path: str) -> dict:
    """name -> Ilúvatar's medians: warm/cold overhead (µs) and warm/cold exec (s)."""
    try:
        with open(path) as f:
            data = json.load(f)["data"]
    except (OSError, ValueError, KeyError) as e:
        raise BenchError(f"cannot read Ilúvatar's results ({type(e).__name__}); pass --json FILE") from None
    out = {}
    for name, d in data.items():
        try:
            out[name] = {
                "warm_over_us": median([float(x) for x in d["warm_over_results_us"]]),
                "cold_over_us": median([float(x) for x in d["cold_over_results_us"]]),
                "warm_exec_s": median([float(x) for x in d["warm_results_sec"]]),
                "cold_exec_s": median([float(x) for x in d["cold_results_sec"]]),
            }
        except (KeyError, TypeError, ValueError):
            raise BenchError(f"Ilúvatar's entry for {name!r} lacks its result lists") from None
    return out


def fmt(v, scale=1.0, digits=1):
    return "–" if v is None else f"{v * scale:.{digits}f}"


def ratio(a, b):
    if a is None or not b:
        return "–"
    r = a / b
    return f"{r:.2g}" if r < 0.01 else f"{r:.3f}" if r < 1 else f"{r:.2f}"


def iluvatar_table(ilu: dict, names) -> str:
    rows = [
        "| function | Ilúvatar warm exec p50 (ms) | warm overhead p50 (ms) | cold exec p50 (ms) | cold overhead p50 (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    for n in names:
        i = ilu.get(n)
        if i is None:
            continue
        rows.append(
            f"| {n} | {fmt(i['warm_exec_s'], 1e3, 3)} | {fmt(i['warm_over_us'], 1e-3, 2)} "
            f"| {fmt(i['cold_exec_s'], 1e3, 3)} | {fmt(i['cold_over_us'], 1e-3, 0)} |"
        )
    return "\n".join(rows)


def summarize(samples: list) -> dict:
    """Medians of one function's samples (each: exec, init, overhead µs from `timing`, client µs)."""
    ok = [s for s in samples if "error" not in s]
    pick = lambda k: [s[k] for s in ok]
    return {
        "n": len(samples),
        "errors": len(samples) - len(ok),
        "exec_us": median(pick("exec")),
        "init_us": median(pick("init")),
        "overhead_us": median(pick("overhead")),
        "client_over_us": median([s["client"] - s["exec"] for s in ok]),
        "paths": sorted({s.get("path") for s in ok if s.get("path")}),
    }


def combined_table(results: dict, ilu: dict) -> str:
    rows = [
        "| function | MB | warm exec p50 (ms) | warm overhead p50 (µs) | warm client − exec p50 (µs) "
        "| Ilúvatar warm overhead p50 (µs) | Hearth/Ilúvatar warm | cold init p50 (ms) "
        "| cold overhead p50 (µs) | cold client − exec p50 (ms) | Ilúvatar cold overhead p50 (ms) "
        "| Hearth/Ilúvatar cold | cold paths |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results["functions"].items():
        w, c, i = summarize(r["warm"]), summarize(r["cold"]), ilu.get(name, {})
        errs = ""
        if w["errors"] or c["errors"] or r.get("register_error"):
            errs = f" (errors: warm {w['errors']}, cold {c['errors']}{', ' + r['register_error'] if r.get('register_error') else ''})"
        rows.append(
            f"| {name}{errs} | {r['memory_mb']} | {fmt(w['exec_us'], 1e-3, 2)} | {fmt(w['overhead_us'], 1, 0)} "
            f"| {fmt(w['client_over_us'], 1, 0)} | {fmt(i.get('warm_over_us'), 1, 0)} "
            f"| {ratio(w['client_over_us'], i.get('warm_over_us'))} | {fmt(c['init_us'], 1e-3, 1)} "
            f"| {fmt(c['overhead_us'], 1, 0)} | {fmt(c['client_over_us'], 1e-3, 1)} "
            f"| {fmt(i.get('cold_over_us'), 1e-3, 0)} | {ratio(c['client_over_us'], i.get('cold_over_us'))} "
            f"| {' '.join(c['paths']) or '–'} |"
        )
    head0 = (
        f"FunctionBench on Hearth ({results['url']}, {results['n']} warm and {results['n']} cold "
        f"invocations per function, {results.get('cpus', '?')} CPUs), beside Ilúvatar's own testbed "
        "(worker_function_benchmarks.json, medians). Ratios: Hearth's client − exec over Ilúvatar's "
        "overhead (the same definition)."
    )
    return head0 + "\n\n" + "\n".join(rows) + "\n\n" + targets(results, ilu)


def targets(results: dict, ilu: dict) -> str:
    """Issue 32's targets, one line: cold client − exec ≤ 1 % of Ilúvatar's cold overhead, and warm
    `timing.overhead` p50 ≤ 0.5 ms, for every function."""
    cold_ok = warm_ok = 0
    worst_cold = worst_warm = None
    names = list(results["functions"])
    for name in names:
        r = results["functions"][name]
        w, c = summarize(r["warm"]), summarize(r["cold"])
        ref = ilu.get(name, {}).get("cold_over_us")
        if c["client_over_us"] is not None and ref and not c["errors"]:
            q = c["client_over_us"] / ref
            cold_ok += q <= 0.01
            worst_cold = max(worst_cold or (q, name), (q, name))
        if w["overhead_us"] is not None and not w["errors"]:
            warm_ok += w["overhead_us"] <= 500
            worst_warm = max(worst_warm or (w["overhead_us"], name), (w["overhead_us"], name))
    wc = f"worst {worst_cold[1]} {worst_cold[0]:.2g}" if worst_cold else "none measured"
    ww = f"worst {worst_warm[1]} {worst_warm[0]:.0f} µs" if worst_warm else "none measured"
    return (
        f"Targets: cold overhead ≤ 1 % of Ilúvatar's: {cold_ok}/{len(names)} functions ({wc}); "
        f"warm overhead p50 ≤ 0.5 ms: {warm_ok}/{len(names)} ({ww})."
    )


# ---------------------------------------------------------------------------------------------
# Talking to Hearth


def api_key() -> str:
    for var in ("HEARTH_API_KEY", "HEARTH_KEY"):
        k = os.environ.get(var, "").strip()
        if k:
            return k
    data = os.environ.get("HEARTH_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"), "hearth"
    )
    for f in (os.path.join(data, "admin.key"), os.path.join(data, "controller", "admin.key")):
        try:
            with open(f) as fh:
                k = fh.read().strip()
        except OSError:
            continue
        if k:
            return k
    return ""


class Api:
    """One persistent HTTP/1.1 connection to Hearth's API."""

    def __init__(self, url: str, key: str):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise BenchError(f"HEARTH_URL must be http(s)://HOST[:PORT], not {url!r}")
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        self.conn = cls(u.hostname, u.port, timeout=120)
        self.url = url
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"

    def call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=data, headers=self.headers)
                resp = self.conn.getresponse()
                raw = resp.read(1 << 20)
                break
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self.conn.close()
                if attempt:
                    raise BenchError(f"Hearth at {self.url} did not answer ({type(e).__name__}): is it running?") from None
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {}
        return resp.status, doc


def hearth(bin_: str, args: list, key: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if key:
        env["HEARTH_API_KEY"] = key
    return subprocess.run([bin_] + args, capture_output=True, text=True, env=env, timeout=900)


def register(bin_: str, api: Api, key: str, name: str, code: str, memory: int, wait: bool):
    """Registers NAME; returns None when it is ready, else a short reason."""
    args = ["fn", "register", name, "--url", api.url, "--code", code, "--memory", str(memory)]
    p = hearth(bin_, args + (["--wait"] if wait else []), key)
    if p.returncode != 0:
        return "register failed: " + (p.stderr.strip().splitlines() or ["?"])[-1][:200]
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        status, doc = api.call("GET", f"/v1/functions/{name}")
        state = doc.get("state") if status == 200 else None
        if state in (None, "ready"):
            return None
        if state == "failed":
            return "layer build failed"
        time.sleep(0.2)
    return "still building after 900 s"


def error_text(doc) -> str:
    """` code: message` of an API error answer, one line, at most 120 characters, no `|` (the
    table is markdown); empty when the answer has none."""
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        err = ": ".join(str(err[k]) for k in ("code", "message") if isinstance(err.get(k), str))
    if not isinstance(err, str) or not err:
        return ""
    return " " + " ".join(err.split()).replace("|", "/")[:120]


def invoke(api: Api, name: str, args: dict) -> dict:
    t0 = time.perf_counter()
    status, doc = api.call("POST", f"/v1/functions/{name}/invoke", args)
    client = (time.perf_counter() - t0) * 1e6
    t = doc.get("timing") if isinstance(doc, dict) else None
    if status != 200 or not isinstance(t, dict):
        return {"error": f"HTTP {status}" + error_text(doc)}
    return {
        "client": client,
        "exec": t.get("exec", 0),
        "init": t.get("init", 0),
        "overhead": t.get("overhead", 0),
        "queue": t.get("queue", 0),
        "cold": bool(doc.get("cold")),
        "path": doc.get("cold_path"),
    }


def pools_at_rest(api: "Api", limit_s: float = 30.0) -> None:
    """Waits (at most `limit_s`) until no generic sandbox is being made and the pools hold
    what they aim to: a cold start then finds what a steady worker has ready (a pre-imported
    sandbox of its layer once the layer has had a cold start), as `hearth bench cold` does."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            g = api.call("GET", "/v1/status")[1].get("generic_pool") or {}
        except BenchError:
            return
        if g.get("creating", 0) == 0 and g.get("ready", 0) >= g.get("target", 0):
            return
        time.sleep(0.05)


def run(opts) -> dict:
    key = api_key()
    api = Api(opts.url, key)
    try:
        status, _ = api.call("GET", "/healthz")
    except BenchError:
        raise BenchError(
            f"no Hearth at {opts.url} (HEARTH_URL): start one (`hearth up`, root with runc) and run again"
        ) from None
    if status != 200:
        raise BenchError(f"Hearth at {opts.url} answered /healthz with HTTP {status}")
    status, _ = api.call("GET", "/v1/functions")
    if status in (401, 403):
        raise BenchError("Hearth refused the API key: set HEARTH_API_KEY (or HEARTH_KEY) to the operator key")
    help_ = hearth(opts.hearth, ["fn", "register", "--help"], key).stdout
    wait = "--wait" in help_
    tag = secrets.token_hex(3)
    results = {"url": opts.url, "n": opts.n, "cpus": os.cpu_count(), "functions": {}}
    names = opts.only or list(manifest())
    spec = manifest()
    made = []
    try:
        for name in names:
            if name not in spec:
                raise BenchError(f"no FunctionBench function {name!r}")
            code, mem, args = os.path.join(FB, name), spec[name]["memory_mb"], spec[name]["args"]
            fname = f"fb-{tag}-{name}"[:64]
            r = {"memory_mb": mem, "warm": [], "cold": []}
            results["functions"][name] = r
            print(f"# {name}: registering", file=sys.stderr, flush=True)
            made.append(fname)
            err = register(opts.hearth, api, key, fname, code, mem, wait)
            if err:
                r["register_error"] = err
                continue
            first = invoke(api, fname, args)
            if "error" in first:
                r["register_error"] = "first invocation: " + first["error"]
                continue
            for _ in range(opts.n):
                s = invoke(api, fname, args)
                if "error" not in s and s["cold"]:
                    s = {"error": "warm invocation went cold"}
                r["warm"].append(s)
            print(f"# {name}: {opts.n} cold starts", file=sys.stderr, flush=True)
            for k in range(opts.n):
                cname = f"fb-{tag}-{name}"[:58] + f"-c{k}"
                made.append(cname)
                err = register(opts.hearth, api, key, cname, code, mem, wait)
                if not err:
                    pools_at_rest(api)
                s = {"error": err} if err else invoke(api, cname, args)
                if "error" not in s and not s["cold"]:
                    s = {"error": "a fresh function's first invocation was warm"}
                r["cold"].append(s)
                api.call("DELETE", f"/v1/functions/{cname}")
    finally:
        for f in made:
            try:
                api.call("DELETE", f"/v1/functions/{f}")
            except BenchError:
                break
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("iluvatar")
    a.add_argument("--json", default=ILUVATAR)
    r = sub.add_parser("run")
    r.add_argument("--n", type=int, default=10)
    r.add_argument("--url", default=os.environ.get("HEARTH_URL", "http://127.0.0.1:7878"))
    r.add_argument("--hearth", default=os.environ.get("HEARTH", os.path.join(ROOT, "target", "release", "hearth")))
    r.add_argument("--json", default=ILUVATAR)
    r.add_argument("--out", help="write the raw results here (JSON)")
    r.add_argument("--only", nargs="*", help="these functions only")
    t = sub.add_parser("table")
    t.add_argument("results")
    t.add_argument("--json", default=ILUVATAR)
    opts = p.parse_args(argv)
    try:
        try:
            ilu = iluvatar_medians(opts.json)
        except BenchError as e:
            if opts.cmd == "iluvatar":
                raise
            print(f"functionbench: {e}; the table leaves Ilúvatar's columns empty", file=sys.stderr)
            ilu = {}
        if opts.cmd == "iluvatar":
            print(iluvatar_table(ilu, list(manifest())))
            return 0
        if opts.cmd == "table":
            try:
                with open(opts.results) as f:
                    results = json.load(f)
            except (OSError, ValueError) as e:
                raise BenchError(f"cannot read results file ({type(e).__name__})") from None
        else:
            if not 1 <= opts.n <= MAX_N:
                raise BenchError(f"N must be 1..{MAX_N}")
            if not os.access(opts.hearth, os.X_OK):
                raise BenchError("build first: cargo build --release -p hearth-cli (or set HEARTH)")
            results = run(opts)
            if opts.out:
                with open(opts.out, "w") as f:
                    json.dump(results, f)
        print(combined_table(results, ilu))
        return 0
    except BenchError as e:
        print(f"functionbench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
