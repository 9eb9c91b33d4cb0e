#!/usr/bin/env python3
"""Contention calibration against one runc worker (issue 17 §2), driven by bench/contention.sh.

  contention.py overcommit URL --work-ms 400 --rounds 3 --clients 1,2,4,8,16
      Rounds of N simultaneous calls of `busy` with {"ms": W, "cpu": true}, each on its own
      warm sandbox: every call needs W ms of CPU, so its execution time is W stretched by
      sharing (ideally max(1, N / CPUs)).
  contention.py creations URL --concurrent 1,2,4,8,12 --rounds 3
      K concurrent calls of a freshly registered hello (no warm sandbox, no generic pool):
      K sandboxes created at once; their init times.
  contention.py memory URL --work-ms 100 --calls 20 --hog-mb 1024
      A warm `busy` (CPU W ms) called one at a time, alone, then beside a second sandbox that
      spins CPU without memory, then beside one that allocates and touches HOG MiB per call.

Each prints one JSON line per setting: {"kind", "x", "samples": [...µs]}. Every input is bounded;
every run is bounded in time and count. The API key is read from HEARTH_API_KEY.
"""
import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

BUSY = os.path.join(os.path.dirname(__file__), "..", "functions", "busy", "main.py")
HELLO = 'def main(args):\n    return {"hello": "world"}\n'


def request(url, method, path, body=None, timeout=120.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    key = os.environ.get("HEARTH_API_KEY")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def register(url, name, src, memory_mb):
    spec = {"code": {"files": {"main.py": src}}, "memory_mb": memory_mb, "timeout_ms": 60000}
    status, _ = request(url, "PUT", f"/v1/functions/{name}", spec)
    if status >= 300:
        sys.exit(f"registering {name}: HTTP {status}")


def invoke(url, name, args):
    """(exec µs, init µs, cold, e2e µs at the worker, µs at the client) of one call, or None
    for an error."""
    t0 = time.monotonic()
    status, a = request(url, "POST", f"/v1/functions/{name}/invoke", args)
    client_us = int((time.monotonic() - t0) * 1e6)
    if status != 200 or not isinstance(a, dict):
        return None
    t = a.get("timing", {})
    return t.get("exec", 0), t.get("init", 0), bool(a.get("cold")), t.get("e2e", 0), client_us


def prewarm(url, name, count):
    status, _ = request(url, "POST", f"/v1/functions/{name}/prewarm", {"count": count})
    if status >= 300:
        sys.exit(f"prewarm of {name}: HTTP {status}")
    # One warm-up call per sandbox, all at once, so every sandbox has imported the handler.
    threads = [threading.Thread(target=invoke, args=(url, name, {"ms": 1, "cpu": True}))
               for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def ints(s, lo, hi):
    v = [int(x) for x in s.split(",") if x]
    if not v or any(not lo <= x <= hi for x in v):
        sys.exit(f"values must be within {lo}-{hi}: {s}")
    return v


def overcommit(a):
    """Rounds of N simultaneous calls, each on its own warm sandbox: N sandboxes runnable at
    once for most of the round (a closed loop would not do: its clients spend much of each
    turn outside the sandboxes, in the HTTP path slowed by the same contention)."""
    busy = open(BUSY).read()
    for n in ints(a.clients, 1, 32):
        name = f"contend-cpu-{n}"
        register(a.url, name, busy, 64)
        prewarm(a.url, name, n)
        prewarm(a.url, name, n)  # a second batch: every sandbox has run once and is idle
        samples, walls = [], []
        for _ in range(a.rounds):
            out = [None] * n

            def one(i):
                out[i] = invoke(a.url, name, {"ms": a.work_ms, "cpu": True})

            threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            walls.append(int((time.monotonic() - t0) * 1e6))
            samples += [x[0] for x in out if x and not x[2]]
            time.sleep(0.2)
        request(a.url, "DELETE", f"/v1/functions/{name}")
        print(json.dumps({"kind": "overcommit", "x": n, "work_ms": a.work_ms, "samples": samples,
                          "walls": walls}), flush=True)


def creations(a):
    for k in ints(a.concurrent, 1, 16):
        samples = []
        for r in range(a.rounds):
            name = f"contend-hello-{k}-{r}"
            register(a.url, name, HELLO, 64)
            out = [None] * k
            def one(i):
                out[i] = invoke(a.url, name, {})
            threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            samples += [x[1] for x in out if x and x[2]]
            request(a.url, "DELETE", f"/v1/functions/{name}")
            time.sleep(0.5)  # let the destroyed sandboxes go before the next round
        print(json.dumps({"kind": "creations", "x": k, "samples": samples}), flush=True)


def memory(a):
    if not 0 <= a.hog_mb <= 4096:
        sys.exit("--hog-mb must be within 0-4096")
    busy = open(BUSY).read()
    register(a.url, "contend-victim", busy, 64)
    register(a.url, "contend-hog", busy, a.hog_mb + 256)
    prewarm(a.url, "contend-victim", 1)
    prewarm(a.url, "contend-hog", 1)
    for label, hog in (("alone", None), ("cpu-hog", {"ms": 200, "cpu": True}),
                       ("mem-hog", {"ms": 1, "mb": a.hog_mb})):
        stop = threading.Event()

        def hogging():
            while not stop.is_set():
                invoke(a.url, "contend-hog", hog)

        t = threading.Thread(target=hogging)
        if hog:
            t.start()
            time.sleep(0.5)
        samples = []
        for _ in range(a.calls):
            r = invoke(a.url, "contend-victim", {"ms": a.work_ms, "cpu": True})
            if r and not r[2]:
                samples.append(r[0])
        stop.set()
        if hog:
            t.join()
        print(json.dumps({"kind": "memory", "x": label, "work_ms": a.work_ms, "samples": samples}),
              flush=True)
    for f in ("contend-victim", "contend-hog"):
        request(a.url, "DELETE", f"/v1/functions/{f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overcommit")
    o.add_argument("url")
    o.add_argument("--work-ms", type=int, default=400)
    o.add_argument("--rounds", type=int, default=3)
    o.add_argument("--clients", default="1,2,4,8,16")
    c = sub.add_parser("creations")
    c.add_argument("url")
    c.add_argument("--concurrent", default="1,2,4,8,12")
    c.add_argument("--rounds", type=int, default=3)
    m = sub.add_parser("memory")
    m.add_argument("url")
    m.add_argument("--work-ms", type=int, default=100)
    m.add_argument("--calls", type=int, default=20)
    m.add_argument("--hog-mb", type=int, default=1024)
    a = p.parse_args()
    if getattr(a, "work_ms", 1) not in range(1, 2001):
        sys.exit("--work-ms must be within 1-2000")
    if not 1 <= getattr(a, "rounds", 1) <= 10 or not 1 <= getattr(a, "calls", 1) <= 200:
        sys.exit("--rounds must be within 1-10 and --calls within 1-200")
    {"overcommit": overcommit, "creations": creations, "memory": memory}[a.cmd](a)


if __name__ == "__main__":
    main()
