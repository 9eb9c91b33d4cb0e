#!/usr/bin/env bash
# Chaos suite (scripts/chaos.py): a 3-member etcd, two controllers and three sim workers on
# loopback under steady sync and async load, while a worker, a controller and an etcd member are
# killed and restarted, a worker is frozen and thawed and a worker is stopped with SIGTERM.
# `--short` is the test suite's form (about a minute); without it each phase lasts 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/chaos.py "$@"
