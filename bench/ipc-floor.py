#!/usr/bin/env python3
"""The floor of any out-of-process sandbox on this host: a bare Unix-socket ping-pong.

Every warm invocation through a sandbox costs at least one round trip between two processes
(worker -> agent -> worker): two wake-ups and two context switches on top of what the same
call costs without a sandbox. This measures that round trip with nothing else in it: P pairs
of processes bounce an 8-byte message over a socketpair for D seconds, and the same four
system calls are timed in one process (write a, read b, write b, read a) so that the
difference is what the switches and wake-ups cost.

    python3 bench/ipc-floor.py [--pairs 1 4] [--seconds 3] [--runs 3] [--cgroups]

Prints round trips/s and CPU microseconds per round trip (both processes, user + system,
from getrusage). Python adds a fraction of a microsecond per system call to every mode alike.
Holds the worker's low-latency PM QoS request while it runs, as a busy worker does.

Three variants say what the agent's design costs. A reader asleep in a blocking read is also
woken each time its peer consumes what it wrote, because the kernel signals the socket
writable: "two sockets" sends each direction on a socket of its own (as the worker and the
agent do), so nobody sleeps on the socket that is signalled; "answer after poll" keeps one
socket and waits with poll(POLLIN), which filters the signal out at the price of one more
system call. --cgroups puts each answering process in its own cpu cgroup, with and without a
CFS quota, as a sandbox's agent.
"""

import argparse
import os
import resource
import select
import socket
import statistics
import time

MSG = b"12345678"


def bounce(sock, deadline, first, wait_poll=False, out=None):
    """Ping-pong until deadline; returns round trips done (counted by the side that starts).
    Reads from sock and writes to out (default: sock)."""
    fd = sock.fileno()
    wfd = fd if out is None else out.fileno()
    n = 0
    read, write, now = os.read, os.write, time.monotonic
    if first:
        while True:
            write(wfd, MSG)
            read(fd, 64)
            n += 1
            if n & 1023 == 0 and now() >= deadline:
                return n  # the peer ends on EOF when this process exits
    if not wait_poll:
        while read(fd, 64):
            write(wfd, MSG)
        return 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    wait = poller.poll
    while True:
        wait()
        if not read(fd, 64):
            return 0
        write(fd, MSG)


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


CGROOT = "/sys/fs/cgroup/cpu/hearth-ipc-floor"


def enter_cgroup(i, quota_us):
    """Moves this process into its own cgroup v1 `cpu` group (as a sandbox's agent is), with a
    CFS quota of quota_us per 100 ms when quota_us > 0."""
    path = os.path.join(CGROOT, "p%d" % i)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(quota_us if quota_us > 0 else -1))
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def remove_cgroups():
    if os.path.isdir(CGROOT):
        for d in os.listdir(CGROOT):
            if os.path.isdir(os.path.join(CGROOT, d)):
                os.rmdir(os.path.join(CGROOT, d))
        os.rmdir(CGROOT)


def run_pairs(pairs, seconds, cgroup=None, wait_poll=False, two=False):
    """P pairs of processes; returns (round trips/s, CPU us per round trip). With cgroup (a CFS
    quota in us, 0 for none), each pair's answering side runs in its own cpu cgroup; with two,
    answers go back on a second socket pair."""
    cpu0 = child_cpu()
    deadline = time.monotonic() + 0.2 + seconds
    kids, pipes = [], []
    for _ in range(pairs):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # answers: written on b2 (the agent's side), read from a2; or both ways on a/b
        a2, b2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if two else (a, b)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the "worker" side: counts and reports through the pipe
            b.close()
            b2.close()
            os.close(r)
            n = bounce(a2, deadline, True, out=a)
            os.write(w, str(n).encode())
            os._exit(0)
        os.close(w)
        pid2 = os.fork()
        if pid2 == 0:  # the "agent" side
            a.close()
            a2.close()
            if cgroup is not None:
                enter_cgroup(len(pipes), cgroup)
            bounce(b, deadline, False, wait_poll, out=b2)
            os._exit(0)
        for sock in {a, b, a2, b2}:
            sock.close()
        kids += [pid, pid2]
        pipes.append(r)
    t0 = time.monotonic()
    total = 0
    for r in pipes:
        total += int(os.read(r, 64) or b"0")
        os.close(r)
    for pid in kids:
        os.waitpid(pid, 0)
    wall = time.monotonic() - t0
    cpu = child_cpu() - cpu0
    return total / wall, cpu / total * 1e6


def run_inproc(seconds):
    """The same four system calls in one process: no wake-up, no switch."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fa, fb = a.fileno(), b.fileno()
    read, write = os.read, os.write
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    deadline = t0 + seconds
    n = 0
    while True:
        write(fa, MSG)
        read(fb, 64)
        write(fb, MSG)
        read(fa, 64)
        n += 1
        if n & 1023 == 0 and time.monotonic() >= deadline:
            break
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return n / wall, cpu / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cgroups", action="store_true",
                    help="also run each pair's answering side in its own cpu cgroup, without and with a 1-CPU CFS quota (root)")
    args = ap.parse_args()
    if not 0 < args.seconds <= 60 or not 0 < args.runs <= 20 or any(not 0 < p <= 64 for p in args.pairs):
        ap.error("--seconds in (0, 60], --runs in 1..20, --pairs in 1..64")
    print("# ipc floor: %d CPUs, %.0fs per run, medians of %d runs" % (os.cpu_count(), args.seconds, args.runs))
    print("%-22s %12s %14s" % ("case", "round trips/s", "CPU us/trip"))
    cases = [("one process (no switch)", lambda: run_inproc(args.seconds))]
    for p in args.pairs:
        cases.append(("%d pair%s" % (p, "" if p == 1 else "s"), (lambda p=p: run_pairs(p, args.seconds))))
        cases.append(("%d, two sockets" % p, (lambda p=p: run_pairs(p, args.seconds, two=True))))
        cases.append(("%d, answer after poll" % p, (lambda p=p: run_pairs(p, args.seconds, wait_poll=True))))
    if args.cgroups:
        for p in args.pairs:
            cases.append(("%d, cgroup" % p, (lambda p=p: run_pairs(p, args.seconds, 0))))
            cases.append(("%d, cgroup, two sockets" % p, (lambda p=p: run_pairs(p, args.seconds, 0, two=True))))
            cases.append(("%d, cgroup+quota" % p, (lambda p=p: run_pairs(p, args.seconds, 100000))))
    qos = hold_low_latency()
    print("# low-latency PM QoS request: %s" % ("held, as a busy worker does" if qos else "not available"))
    try:
        run_cases(cases, args.runs)
    finally:
        remove_cgroups()
        if qos:
            qos.close()


def hold_low_latency():
    """The PM QoS request a busy worker holds (crates/worker/src/latency.rs): idle CPUs stay in
    shallow idle states while the file is open. None where the device is missing or not ours."""
    try:
        f = open("/dev/cpu_dma_latency", "wb", buffering=0)
        f.write(b"\0\0\0\0")
        return f
    except OSError:
        return None


def run_cases(cases, runs):
    for name, fn in cases:
        res = [fn() for _ in range(runs)]
        rate = statistics.median(r[0] for r in res)
        cpu = statistics.median(r[1] for r in res)
        print("%-22s %12.0f %14.1f" % (name, rate, cpu))


if __name__ == "__main__":
    main()
