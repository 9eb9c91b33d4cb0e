#!/usr/bin/env python3
"""Chaos suite for a Hearth cluster on loopback (issue 12).

Starts a 3-member etcd, two controllers and three sim workers (all on 127.0.0.1, in a temporary
directory), keeps a steady mix of sync and async calls going against both controllers, and
injects faults in turn: kill -9 and restart of a worker, of a controller and of an etcd member,
a worker frozen (SIGSTOP) and thawed, a worker stopped with SIGTERM. Per fault it prints:

* async lost: accepted async calls (202) whose id never ended (404 or still running): must be 0
* async twice: async results that changed between reads (two final results): must be 0
* sync hung: sync calls that got no answer within their timeout: must be 0
* sync failed: sync calls answered with an error, by code (only those in flight on a killed
  worker may fail)
* stop routing: ms until every controller stopped routing to the dead or frozen worker

Bounded: every phase has a fixed length and every process it starts is killed at the end, by
PID. Exit status 1 when an invariant is broken.

    scripts/chaos.py [--short] [--hearth target/debug/hearth] [--phase-s 6]
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import chaos_compromised
import chaos_etcd

SYNC_TIMEOUT_S = 10.0  # the function's timeout (2 s) + the controller's grace (2 s) + slack


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process this script started, restartable with the same command."""

    def __init__(self, name, argv, env, log):
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.p = None
        self.start()

    def start(self):
        with open(self.log, "ab") as log:
            self.p = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.DEVNULL,
                                      stderr=log, stdin=subprocess.DEVNULL)

    def signal(self, sig):
        if self.p and self.p.poll() is None:
            os.kill(self.p.pid, sig)

    def kill(self):
        self.signal(signal.SIGKILL)
        if self.p:
            self.p.wait()

    def stop(self, timeout=60):
        """SIGTERM (after a SIGCONT, in case it is frozen) and wait; SIGKILL after timeout."""
        if not self.p or self.p.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def request(base, method, path, key, body=None, headers=None, timeout=5.0):
    """One HTTP request; returns (status, parsed JSON or None). Raises OSError on failure."""
    host, port = base.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data) if data else None
        except ValueError:
            return r.status, None
    finally:
        c.close()


def wait_for(what, cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"chaos: timed out waiting for {what}")


class Cluster:
    def __init__(self, hearth, root):
        self.hearth, self.root = hearth, root
        self.procs = []
        env = dict(os.environ)
        env.pop("HEARTH_API_KEY", None)
        self.env = env
        # etcd, 3 members, secured as deploy/ sets it up: TLS, client certificates, users
        self.pki = chaos_etcd.secure_setup(root)
        names = [f"e{i}" for i in range(3)]
        cports = [free_port() for _ in names]
        pports = [free_port() for _ in names]
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, pports))
        self.etcd = []
        for n, cp, pp in zip(names, cports, pports):
            d = os.path.join(root, n)
            argv = ["etcd", "--name", n, "--data-dir", d,
                    "--listen-client-urls", f"https://127.0.0.1:{cp}",
                    "--advertise-client-urls", f"https://127.0.0.1:{cp}",
                    "--listen-peer-urls", f"http://127.0.0.1:{pp}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"chaos-{os.getpid()}",
                    "--heartbeat-interval", "50", "--election-timeout", "500"
                    ] + chaos_etcd.etcd_args(self.pki)
            self.etcd.append(self.spawn(f"etcd-{n}", argv, {}))
        self.store = "etcds://" + ",".join(f"127.0.0.1:{p}" for p in cports)
        self.etcd_endpoints = ",".join(f"https://127.0.0.1:{p}" for p in cports)
        self.etcd_ready()
        chaos_etcd.create_users(self, [f"chaos-w{i}" for i in range(3)])
        # A call on a frozen worker ends at the function's timeout (2 s) + forward_grace_ms.
        common = {"HEARTH_LEASE_TTL_MS": "1000", "HEARTH_STATUS_INTERVAL_MS": "100",
                  "HEARTH_FORWARD_GRACE_MS": "2000",
                  "HEARTH_ASYNC_RETRY_BACKOFF_MS": "200", "HEARTH_SHUTDOWN_GRACE_S": "10",
                  "HEARTH_LOG": "info"}
        self.controllers = []
        for i in range(2):
            port = free_port()
            d = os.path.join(root, f"controller{i}")
            argv = [hearth, "controller", "--store", self.store, "--balance", "ch-bl",
                    "--listen", f"127.0.0.1:{port}", "--data-dir", d]
            p = self.spawn(f"controller{i}", argv,
                           dict(common, **chaos_etcd.controller_env(self.pki)))
            p.url, p.data_dir = f"http://127.0.0.1:{port}", d
            self.controllers.append(p)
            wait_for(f"controller{i}", lambda p=p: self.healthy(p.url), 30)
        self.key = open(os.path.join(self.controllers[0].data_dir, "admin.key")).read().strip()
        self.workers = []
        for i in range(3):
            port = free_port()
            d = os.path.join(root, f"worker{i}")
            argv = [hearth, "worker", "--backend", "sim", "--store", self.store,
                    "--listen", f"127.0.0.1:{port}", "--data-dir", d]
            # Each worker gets a credential of its own, made by the operator for its id.
            wid = f"chaos-w{i}"
            status, v = request(self.controllers[0].url, "POST", "/v1/cluster/credentials",
                                self.key, body=json.dumps({"worker": wid}).encode())
            assert status == 201, (status, v)
            cred = os.path.join(root, f"{wid}.credential")
            fd = os.open(cred, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(v["file"])
            p = self.spawn(f"worker{i}", argv,
                           dict(common, HEARTH_CLUSTER_KEY_FILE=cred, HEARTH_WORKER_ID=wid,
                                **chaos_etcd.worker_env(self.pki, wid)))
            p.url, p.id, p.data_dir, p.credential = f"http://127.0.0.1:{port}", wid, d, cred
            self.workers.append(p)
        for w in self.workers:
            wait_for(w.name, lambda w=w: self.healthy(w.url), 30)
        wait_for("every controller sees every worker",
                 lambda: all(self.up(c) == {w.id for w in self.workers} for c in self.controllers), 30)

    def spawn(self, name, argv, env):
        p = Proc(name, argv, dict(self.env, **env), os.path.join(self.root, f"{name}.log"))
        self.procs.append(p)
        return p

    def etcd_ready(self):
        eps, pki = self.etcd_endpoints, self.pki
        wait_for("etcd", lambda: subprocess.run(
            ["etcdctl", "--endpoints", eps, "--cacert", pki.path("ca.pem"),
             "--cert", pki.path("client.pem"), "--key", pki.path("client-key.pem"),
             "put", "/chaos/ready", "1"],
            env=dict(self.env, ETCDCTL_API="3"), capture_output=True, timeout=5).returncode == 0, 30)

    @staticmethod
    def healthy(url):
        host, port = url.split("//")[1].split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=1)
        try:
            c.request("GET", "/healthz")
            return c.getresponse().status == 200
        finally:
            c.close()

    def up(self, controller):
        status, v = request(controller.url, "GET", "/v1/status", self.key, timeout=2)
        if status != 200:
            return set()
        return {w["worker"] for w in v["workers"] if w["up"]}

    def close(self):
        for p in reversed(self.procs):
            p.stop(timeout=30)


class Load:
    """Closed-loop clients, half sync and half async, spread over both controllers."""

    def __init__(self, cluster, clients):
        self.c = cluster
        self.lock = threading.Lock()
        self.running = True
        self.accepted = []       # (id, phase)
        self.sync = []           # (phase, outcome)
        self.errors = []         # (phase, message) of failed sync calls
        self.phase = "warmup"
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                        for i in range(clients)]
        for t in self.threads:
            t.start()

    def client(self, i):
        rnd = random.Random(i)
        while self.running:
            is_async = i % 2 == 1
            order = list(self.c.controllers)
            rnd.shuffle(order)
            outcome, accepted = None, None
            for ctl in order:  # a client fails over when it cannot connect
                path = "/v1/functions/work/invoke" + ("?async=true" if is_async else "")
                t0 = time.time()
                try:
                    status, v = request(ctl.url, "POST", path, self.c.key, body=b"{}",
                                        timeout=SYNC_TIMEOUT_S)
                except ConnectionRefusedError:
                    continue
                except socket.timeout:
                    outcome = "hung"
                    break
                except OSError:
                    # Cut while in flight: its controller died under it.
                    outcome = "cut"
                    break
                if is_async:
                    if status == 202:
                        accepted = v["id"]
                    else:
                        outcome = f"accept {status}"
                else:
                    code = "ok" if status == 200 else (v or {}).get("error", {}).get("code", status)
                    outcome = code if time.time() - t0 < SYNC_TIMEOUT_S else "hung"
                    if code != "ok":
                        with self.lock:
                            self.errors.append((self.phase, (v or {}).get("error", {}).get("message", "")))
                break
            else:
                outcome = "no controller"
            # Failures count in the phase they happen in (a call cut by a fault may have
            # started just before it).
            phase = self.phase
            with self.lock:
                if accepted:
                    self.accepted.append((accepted, phase))
                elif is_async:
                    self.sync.append((phase, f"async {outcome}"))
                else:
                    self.sync.append((phase, outcome))
            if accepted:
                self.await_result(accepted, rnd)
            time.sleep(0.005)

    def await_result(self, aid, rnd):
        """Closed loop: an async client waits for its result (from either controller) before
        its next call, so the load stays bounded."""
        deadline = time.time() + 30
        while self.running and time.time() < deadline:
            ctl = rnd.choice(self.c.controllers)
            try:
                status, v = request(ctl.url, "GET", f"/v1/invocations/{aid}", self.c.key)
                if status == 200 and v["status"] != "running":
                    return
            except OSError:
                pass
            time.sleep(0.02)

    def stop(self):
        self.running = False
        for t in self.threads:
            t.join(SYNC_TIMEOUT_S + 5)


def stop_routing_ms(cluster, worker, t0, limit=15):
    """ms until no controller lists `worker` as up (None if it never happened)."""
    deadline = t0 + limit
    while time.time() < deadline:
        try:
            if all(worker.id not in cluster.up(c) for c in cluster.controllers):
                return int((time.time() - t0) * 1000)
        except OSError:
            pass
        time.sleep(0.02)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--short", action="store_true", help="short phases (the test suite's form)")
    ap.add_argument("--hearth", default=None)
    ap.add_argument("--phase-s", type=float, default=None)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The most recently built of the release and debug binaries.
    built = [p for p in (os.path.join(root_dir, "target/release/hearth"),
                         os.path.join(root_dir, "target/debug/hearth")) if os.path.exists(p)]
    hearth = args.hearth or max(built, key=os.path.getmtime, default=None)
    if not hearth:
        raise SystemExit("chaos: build hearth first (cargo build -p hearth-cli)")
    if shutil.which("etcd") is None:
        raise SystemExit("chaos: etcd is not installed (apt-get install etcd-server)")
    phase_s = args.phase_s or (3.0 if args.short else 10.0)
    root = tempfile.mkdtemp(prefix="hearth-chaos-")
    cluster = None
    broken = []
    try:
        cluster = Cluster(hearth, root)
        c0 = cluster.controllers[0]
        spec = {"runtime": "python3", "sim_warm_ms": 50, "timeout_ms": 2000, "memory_mb": 64}
        status, v = request(c0.url, "PUT", "/v1/functions/work", cluster.key,
                            body=json.dumps(spec).encode())
        assert status in (200, 201), (status, v)
        time.sleep(0.5)
        load = Load(cluster, args.clients)
        time.sleep(phase_s / 2)
        routing = {}

        def fault(name, inject, recover, watch=None):
            load.phase = name
            t0 = time.time()
            inject()
            if watch is not None:
                routing[name] = stop_routing_ms(cluster, watch, t0)
            remaining = phase_s - (time.time() - t0)
            if remaining > 0:
                time.sleep(remaining)
            recover()
            time.sleep(phase_s / 2)

        w0, w1, w2 = cluster.workers
        fault("worker kill -9", w0.kill, lambda: (w0.start(), time.sleep(1)), watch=w0)
        fault("controller kill -9", c0.kill, lambda: (c0.start(), time.sleep(1)))
        e1 = cluster.etcd[1]
        fault("etcd member kill -9", e1.kill, lambda: (e1.start(), time.sleep(1)))
        fault("worker frozen", lambda: w1.signal(signal.SIGSTOP),
              lambda: w1.signal(signal.SIGCONT), watch=w1)
        fault("worker SIGTERM", lambda: w2.signal(signal.SIGTERM),
              lambda: (w2.p.wait(30), w2.start(), time.sleep(1)), watch=w2)
        load.phase = "cool-down"
        time.sleep(phase_s / 2)
        load.stop()

        # Every accepted id must end with one result, the same from both controllers.
        results = {}
        deadline = time.time() + 60
        pending = list(load.accepted)
        while pending and time.time() < deadline:
            rest = []
            for aid, phase in pending:
                try:
                    status, v = request(cluster.controllers[1].url, "GET",
                                        f"/v1/invocations/{aid}", cluster.key)
                except OSError:
                    rest.append((aid, phase))
                    continue
                if status == 200 and v["status"] != "running":
                    results[aid] = (phase, v)
                else:
                    rest.append((aid, phase))
            pending = rest
            if pending:
                time.sleep(0.2)
        twice = {}
        for aid, (phase, v) in results.items():
            status, again = request(cluster.controllers[0].url, "GET", f"/v1/invocations/{aid}",
                                    cluster.key)
            if status != 200 or again != v:
                twice[phase] = twice.get(phase, 0) + 1
        lost = {}
        for aid, phase in pending:
            lost[phase] = lost.get(phase, 0) + 1

        phases = ["warmup", "worker kill -9", "controller kill -9", "etcd member kill -9",
                  "worker frozen", "worker SIGTERM", "cool-down"]
        print(f"{'phase':<22}{'async ok':>9}{'lost':>6}{'twice':>7}{'sync ok':>9}{'hung':>6}"
              f"  {'sync failed':<40}{'stop routing':>13}")
        for ph in phases:
            ok_async = sum(1 for _, (p, v) in results.items() if p == ph and v["status"] == "succeeded")
            sync = [o for p, o in load.sync if p == ph]
            hung = sync.count("hung")
            failed = {}
            for o in sync:
                if o not in ("ok", "hung"):
                    failed[o] = failed.get(o, 0) + 1
            failed_s = ", ".join(f"{k} {n}" for k, n in sorted(failed.items())) or "-"
            r = routing.get(ph)
            r_s = "-" if ph not in routing else (f"{r} ms" if r is not None else "never")
            print(f"{ph:<22}{ok_async:>9}{lost.get(ph, 0):>6}{twice.get(ph, 0):>7}"
                  f"{sync.count('ok'):>9}{hung:>6}  {failed_s:<40}{r_s:>13}")
            if lost.get(ph, 0):
                broken.append(f"{ph}: {lost[ph]} accepted async calls lost")
            if twice.get(ph, 0):
                broken.append(f"{ph}: {twice[ph]} async results seen twice")
            if hung:
                broken.append(f"{ph}: {hung} sync calls hung")
            # Only calls in flight on a killed process may fail.
            # (A frozen worker's calls may outlive their timeout while it is frozen.)
            allowed = {"worker kill -9": {"worker_failed"},
                       "controller kill -9": {"cut", "async cut"},
                       "worker frozen": {"timeout", "worker_timeout"}}.get(ph, set())
            bad = {k: n for k, n in failed.items() if k not in allowed}
            if bad:
                broken.append(f"{ph}: sync or accept failures {bad}")
            if ph in routing and routing[ph] is None:
                broken.append(f"{ph}: controllers kept routing to the worker")
        for ph, msg in load.errors[:10]:
            print(f"  {ph}: {msg[:200]}")
        total_async = len(load.accepted)
        print(f"accepted async: {total_async}, sync calls: {len(load.sync)}")
        broken += chaos_compromised.run(cluster, request, wait_for)
        chaos_etcd.run(cluster, broken)
    finally:
        if cluster:
            cluster.close()
        if os.environ.get("CHAOS_KEEP"):
            print(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if broken:
        print("chaos: BROKEN\n  " + "\n  ".join(broken))
        return 1
    print("chaos: every invariant held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
