#!/usr/bin/env bash
# Fails if any Hearth sandbox outlived its worker: runc containers named hearth-*, cgroups under
# /hearth in any hierarchy, or mounts of sandbox bundles.
set -uo pipefail
bad=0
for d in /sys/fs/cgroup/*/hearth; do
    [ -d "$d" ] || continue
    if [ -n "$(find "$d" -mindepth 1 -type d 2>/dev/null | head -1)" ]; then
        echo "leftover cgroups under $d:" >&2
        find "$d" -mindepth 1 -type d >&2
        bad=1
    fi
done
if grep -E '/sandboxes/[0-9]+|hearth-test-' /proc/self/mountinfo >&2; then
    echo "leftover sandbox mounts (above)" >&2
    bad=1
fi
if pgrep -f 'hearth_agent.py' >&2; then
    echo "leftover agent processes (above)" >&2
    bad=1
fi
if pgrep -f 'hearth worker' >&2; then
    echo "leftover hearth workers (above)" >&2
    bad=1
fi
[ "$bad" = 0 ] && echo "leftovers: none (no sandbox, cgroup, mount, agent or worker left behind)"
exit "$bad"
