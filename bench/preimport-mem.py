#!/usr/bin/env python3
"""Memory of ready generic agents, bare and pre-imported (issue 32 item 3).

Starts N agents of each kind as the worker starts a generic sandbox's agent (`python3 -I -S
hearth_agent.py --generic`, HEARTH_DEPS, HEARTH_PREIMPORT), waits until each answers health, and
reads /proc/PID/smaps_rollup: RSS (private + shared pages mapped), PSS (shared pages divided among
their mappers) and the private part. The interpreter, the agent and the layer's files are the same
files a runc sandbox maps (its /usr is the host's or the runtime image's, its layer an overlay whose
pages are the lower files' page cache), so the page sharing between two agents is the sandboxes'.

usage: preimport-mem.py SITE_DIR [MODULES=numpy,PIL] [N=4] [PYTHON=/usr/bin/python3]
"""
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime", "python", "hearth_agent.py")


def rollup(pid):
    out = {}
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1])
    return out


def health(path, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.sendall(struct.pack(">IB3xQ", 0, ord("H"), 1))
            hdr = b""
            while len(hdr) < 24:
                hdr += s.recv(24 - len(hdr))
            n = struct.unpack(">IHHQQ", hdr)[0]
            body = b""
            while len(body) < n:
                body += s.recv(n - len(body))
            s.close()
            return json.loads(body)
        except OSError:
            time.sleep(0.01)
    raise SystemExit("agent at %s never answered" % path)


def start(tmp, i, env):
    sock = os.path.join(tmp, "a%d.sock" % i)
    p = subprocess.Popen(
        [PYTHON, "-I", "-S", AGENT, "--generic", "--socket", sock],
        env={**env, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp,
    )
    t0 = time.perf_counter()
    h = health(sock)
    return p, h, (time.perf_counter() - t0) * 1000


def measure(kind, env, n):
    tmp = tempfile.mkdtemp(prefix="hmem-", dir="/tmp")
    procs = [start(tmp, i, env) for i in range(n)]
    time.sleep(0.2)
    rows = [rollup(p.pid) for p, _, _ in procs]
    ready_ms = sorted(ms for _, _, ms in procs)
    for p, _, _ in procs:
        p.kill()
        p.wait()
    mb = lambda k: [r.get(k, 0) / 1024 for r in rows]
    private = [(r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)) / 1024 for r in rows]
    avg = lambda v: sum(v) / len(v)
    print(
        "%-12s n=%d  RSS %6.1f MB  PSS %6.1f MB  private %6.1f MB  shared %6.1f MB  ready in %6.1f ms (median)%s"
        % (
            kind,
            n,
            avg(mb("Rss")),
            avg(mb("Pss")),
            avg(private),
            avg(mb("Rss")) - avg(private),
            ready_ms[len(ready_ms) // 2],
            "  preimported=%s" % procs[0][1].get("preimported") if procs[0][1].get("preimported") else "",
        )
    )


if __name__ == "__main__":
    site = sys.argv[1]
    modules = sys.argv[2] if len(sys.argv) > 2 else "numpy,PIL"
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    PYTHON = sys.argv[4] if len(sys.argv) > 4 else "/usr/bin/python3"
    base = {"HEARTH_MAX_RESULT_BYTES": "6291456"}
    measure("bare", base, n)
    measure("deps only", {**base, "HEARTH_DEPS": site}, n)
    measure("pre-imported", {**base, "HEARTH_DEPS": site, "HEARTH_PREIMPORT": modules}, n)
