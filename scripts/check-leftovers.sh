#!/usr/bin/env bash
# Fails if any sandbox of the test suite outlived its worker: cgroups of test workers
# (/hearth/test_<port> in any hierarchy), mounts of test data directories, agents or workers still
# running from a test, etcd members of a test. Test workers are named test-<port> (crates/cli/tests/common), so sandboxes of
# a Hearth the operator runs on the same machine are not mistaken for the suite's.
set -uo pipefail
bad=0
for d in /sys/fs/cgroup/*/hearth; do
    [ -d "$d" ] || continue
    left=$(find "$d" -mindepth 1 -maxdepth 1 -type d -name 'test_*' 2>/dev/null)
    if [ -n "$left" ]; then
        echo "leftover test cgroups under $d:" >&2
        echo "$left" >&2
        bad=1
    fi
done
# Every mount a worker makes for a sandbox (its root tmpfs, code overlay or code mount point, and
# run tmpfs) lies in its bundle under the test's data directory.
if grep -E 'hearth-test-' /proc/self/mountinfo >&2; then
    echo "leftover sandbox mounts of test workers (above)" >&2
    bad=1
fi
for p in /proc/[0-9]*; do
    if grep -qs ':/hearth/test_' "$p/cgroup"; then
        echo "leftover process in a test sandbox: ${p#/proc/} $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" >&2
        bad=1
    fi
done
if pgrep -af 'hearth (worker|controller|up) .*hearth-test-' >&2; then
    echo "leftover test workers or controllers (above)" >&2
    bad=1
fi
if pgrep -af 'etcd .*hearth-etcd-' >&2; then
    echo "leftover test etcd members (above)" >&2
    bad=1
fi
[ "$bad" = 0 ] && echo "leftovers: none (no test sandbox, cgroup, mount, agent or worker left behind)"
exit "$bad"
