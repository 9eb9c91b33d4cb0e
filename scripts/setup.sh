#!/usr/bin/env bash
# Installs what Hearth needs on Debian 12 (runc, etcd, protoc, a C toolchain, Python 3, Rust) and
# builds it.
# Idempotent; run as root (or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
# A C toolchain: Rust's linker, and gcc and make for the CUDA shim (runtime/gpu-shim).
{ command -v cc && command -v gcc && command -v make; } >/dev/null 2>&1 || need_apt+=(build-essential)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
# etcd (clusters of several controllers, and the tests that run one) and protoc (the etcd
# client's gRPC code is generated at build time).
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
# openssl: the chaos suite's etcd certificates, deploy/etcd/make-certs.sh.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)  # bench/burst.sh cross-checks with a third-party load tool
# The font of `hearth report`'s plots.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
# Runtime images: mmdebstrap builds them from Debian's packages, umoci imports OCI archives.
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
command -v umoci >/dev/null 2>&1 || need_apt+=(umoci)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: installing the Rust toolchain with rustup" >&2
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    . "$HOME/.cargo/env"
fi

cargo build --release --locked -p hearth-cli
# The CUDA shim of GPU sandboxes, beside the binary where the worker looks for it (docs/gpu.md).
make -s -C runtime/gpu-shim OUT="$(pwd)/target/release"
# The default runtime image sandboxes run on (docs/runtimes.md), and the wheelhouse dependency
# builds install from without a network (docs/dependencies.md): the only downloads, both here.
scripts/build-runtime.sh target/release/hearth
scripts/wheelhouse.sh
echo "setup: built $(pwd)/target/release/hearth" >&2
