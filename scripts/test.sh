#!/usr/bin/env bash
# The whole test suite: formatting, lints, Rust unit and end-to-end tests (real runc sandboxes
# included: run as root with runc installed), the agent's pytest suite, and a final check that no
# sandbox, cgroup, mount or socket was left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
HEARTH_REQUIRE_RUNC=1 HEARTH_REQUIRE_ETCD=1 cargo test --workspace --locked
# The chaos suite's short form: etcd, two controllers and three workers under load while their
# parts are killed, frozen and stopped (about a minute).
scripts/chaos.sh --short --hearth target/debug/hearth
scripts/check-leftovers.sh
python3 -m pytest runtime/python/tests runtime/gpu-shim/tests functions/functionbench/tests -q -p no:cacheprovider
