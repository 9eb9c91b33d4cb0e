#!/usr/bin/env python3
"""Micro-benchmark of the worker <-> agent protocol: sequential invoke round trips.

Starts runtime/python/hearth_agent.py (or --agent PATH) with a no-op handler in a temporary
directory, sends N invokes (args `{}`) one after another over its Unix socket from a Python
client, and prints invocations/s, microseconds per round trip and the agent process's CPU
time per call (utime+stime from /proc/<pid>/stat, before/after the timed loop; also the
finer on-CPU time from /proc/<pid>/schedstat).

    python3 bench/agent-proto.py                      # the frame protocol (this repo's agent)
    python3 bench/agent-proto.py --http --agent OLD   # an HTTP/1.1 agent (before the frames)
    python3 bench/agent-proto.py --vs-http OLD --runs 3   # alternate both, print medians
    python3 bench/agent-proto.py --inproc --vs-http OLD --runs 3   # the agents' Python work only

The old HTTP agent: `git show 25b9fa8:runtime/python/hearth_agent.py > /tmp/hearth_agent_http.py`.
"""

import argparse
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO_AGENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "python", "hearth_agent.py")
CLK_TCK = os.sysconf("SC_CLK_TCK")
REQ_HDR = struct.Struct(">IB3xQ")  # payload length, op, 3 zero bytes, request id
RESP_HDR = struct.Struct(">IHHQQ")  # body length, status, flags, exec_us, request id
RID = 0x5EED_F00D_CAFE_BEEF  # one id for every request: the agent does the same work for any


def sched_ns(pid):
    """On-CPU time in ns from /proc/<pid>/schedstat (finer than stat's clock ticks), or None."""
    try:
        with open("/proc/%d/schedstat" % pid) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid):
    """(user, system) CPU seconds of pid from /proc/<pid>/stat."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    # after "pid (comm)": state is fields[0]; utime, stime are stat fields 14 and 15
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


class FrameClient:
    def __init__(self, sock):
        self.sock = sock
        self.req = REQ_HDR.pack(2, ord("I"), RID) + b"{}"
        self.buf = bytearray(1 << 16)
        self.mv = memoryview(self.buf)

    def invoke(self):
        sock = self.sock
        sock.sendall(self.req)
        have = sock.recv_into(self.buf)
        while have < 24:
            have += sock.recv_into(self.mv[have:])
        n, status, _flags, _exec_us, rid = RESP_HDR.unpack_from(self.buf)
        while have < 24 + n:
            have += sock.recv_into(self.mv[have:])
        if status != 200 or rid != RID:
            raise RuntimeError("status %d, id %#x: %r" % (status, rid, bytes(self.buf[24 : 24 + n])))


class HttpClient:
    def __init__(self, sock):
        self.sock = sock
        self.req = b"POST /invoke HTTP/1.1\r\nHost: agent\r\nContent-Length: 2\r\n\r\n{}"
        self.buf = b""

    def invoke(self):
        sock = self.sock
        sock.sendall(self.req)
        buf = self.buf
        while True:
            idx = buf.find(b"\r\n\r\n")
            if idx >= 0:
                break
            buf += sock.recv(1 << 16)
        head = buf[:idx]
        if not head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError("unexpected answer: %r" % head[:100])
        clen = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                clen = int(value)
        end = idx + 4 + clen
        while len(buf) < end:
            buf += sock.recv(1 << 16)
        self.buf = buf[end:]


def run_once(agent_path, http, n, warmup, python, pin):
    work = tempfile.mkdtemp(dir="/tmp", prefix="hbench-")
    proc = None
    try:
        code = os.path.join(work, "code")
        os.makedirs(code)
        with open(os.path.join(code, "main.py"), "w") as f:
            f.write("def main(args):\n    return {}\n")
        sock_path = os.path.join(work, "a.sock")
        proc = subprocess.Popen(
            [python, "-I", "-S", agent_path, "--socket", sock_path, "--code-dir", code, "--handler", "main.main"],
            stdout=subprocess.DEVNULL,
        )
        if pin:  # client on one CPU, agent on another (default: wherever the scheduler puts them)
            os.sched_setaffinity(proc.pid, {pin[1]})
            os.sched_setaffinity(0, {pin[0]})
        deadline = time.monotonic() + 10
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(sock_path)
                break
            except OSError:
                sock.close()
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the agent did not start")
                time.sleep(0.01)
        client = (HttpClient if http else FrameClient)(sock)
        for _ in range(warmup):
            client.invoke()
        invoke = client.invoke
        cpu0 = cpu_seconds(proc.pid)
        ns0 = sched_ns(proc.pid)
        t0 = time.perf_counter()
        for _ in range(n):
            invoke()
        elapsed = time.perf_counter() - t0
        cpu1 = cpu_seconds(proc.pid)
        ns1 = sched_ns(proc.pid)
        sock.close()
        user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        r = {
            "per_s": n / elapsed,
            "rt_us": elapsed / n * 1e6,
            "agent_cpu_us": (user + system) / n * 1e6,
            "user_us": user / n * 1e6,
            "sys_us": system / n * 1e6,
        }
        if ns0 is not None and ns1 is not None:
            r["sched_us"] = (ns1 - ns0) / n / 1000
        return r
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


class FakeConn:
    """Stands in for the socket: every recv_into gets one whole request, sends are dropped."""

    def __init__(self, request, n):
        self.request = request
        self.left = n

    def recv_into(self, buf, nbytes=0):
        if not self.left:
            return 0
        self.left -= 1
        size = len(self.request)
        buf[:size] = self.request
        return size

    def recvmsg(self, bufsize, ancbufsize=0, flags=0):
        # The connection's first read (socket.recv_fds): a request and no descriptor, so the
        # agent answers on the connection.
        buf = bytearray(bufsize)
        n = self.recv_into(buf)
        return bytes(buf[:n]), [], 0, None

    def sendall(self, data):
        pass

    def sendmsg(self, bufs):
        return sum(len(b) for b in bufs)


def run_inproc(agent_path, http, n, warmup):
    """The agent's own per-call Python work (parse, dispatch, no-op handler, answer), no syscalls."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_agent_%d" % id(agent_path), agent_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    agent = mod.Agent(lambda args: {}, 0, None)
    if http:
        request = b"POST /invoke HTTP/1.1\r\nHost: agent\r\nContent-Length: 2\r\n\r\n{}"
    else:
        request = REQ_HDR.pack(2, ord("I"), RID) + b"{}"
    agent.serve_connection(FakeConn(request, warmup))
    t0 = time.process_time()
    agent.serve_connection(FakeConn(request, n))
    cpu = time.process_time() - t0
    return {"per_s": n / cpu, "rt_us": cpu / n * 1e6, "agent_cpu_us": cpu / n * 1e6, "user_us": 0.0, "sys_us": 0.0}


def show(label, r):
    extra = "  (schedstat %6.2f us)" % r["sched_us"] if "sched_us" in r else ""
    print(
        "%-8s %7.0f invocations/s  %6.2f us/round trip  %6.2f us agent CPU/call"
        " (user %5.2f, sys %5.2f)%s"
        % (label, r["per_s"], r["rt_us"], r["agent_cpu_us"], r["user_us"], r["sys_us"], extra),
        flush=True,
    )


def median(runs):
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", default=REPO_AGENT, help="agent to start (default: this repo's)")
    ap.add_argument("--http", action="store_true", help="speak HTTP/1.1 to it (the old agent)")
    ap.add_argument("--vs-http", metavar="OLD_AGENT", help="alternate --agent (frames) with this HTTP agent")
    ap.add_argument("-n", type=int, default=50000, help="timed invocations per run")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--python", default=sys.executable, help="interpreter for the agent (a sandbox runs /usr/bin/python3)")
    ap.add_argument("--pin", action="store_true", help="pin client and agent to two different CPUs")
    ap.add_argument(
        "--inproc",
        action="store_true",
        help="load the agent in this process and time its serve loop on a fake socket (no syscalls)",
    )
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pin = cpus[:2] if a.pin and len(cpus) >= 2 else None

    configs = [("frames" if not a.http else "http", a.agent, a.http)]
    if a.vs_http:
        configs = [("frames", a.agent, False), ("http", a.vs_http, True)]
    results = {label: [] for label, _, _ in configs}
    for i in range(a.runs):
        for label, path, http in configs:
            if a.inproc:
                r = run_inproc(path, http, a.n, a.warmup)
                results[label].append(r)
                print("%-8s %6.2f us of agent CPU per call (in process, no syscalls)" % ("%s#%d" % (label, i + 1), r["rt_us"]))
            else:
                r = run_once(path, http, a.n, a.warmup, a.python, pin)
                results[label].append(r)
                show("%s#%d" % (label, i + 1), r)
    if a.runs > 1:
        print("median of %d runs, %d invocations each:" % (a.runs, a.n))
        for label, _, _ in configs:
            if a.inproc:
                print("%-8s %6.2f us of agent CPU per call (in process, no syscalls)" % (label, median(results[label])["rt_us"]))
            else:
                show(label, median(results[label]))


if __name__ == "__main__":
    main()
