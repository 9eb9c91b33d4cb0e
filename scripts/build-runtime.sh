#!/usr/bin/env bash
# Builds Hearth's default runtime image (python3.11: Debian bookworm's python3 + pip, from
# Debian's own packages with mmdebstrap) into the host's runtime store, unless it is there.
# Usage: scripts/build-runtime.sh [HEARTH_BINARY]   (as root; ~25-70 s the first time)
set -euo pipefail
cd "$(dirname "$0")/.."
H=${1:-target/release/hearth}
if ! command -v mmdebstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap
fi
"$H" runtime build python3.11 --if-missing
