#!/usr/bin/env bash
# Makes the private CA of the cluster's etcd and the certificates deploy/README.md installs,
# on an admin host (openssl), into ./etcd-pki (0700):
#   ca.pem, ca.key                 the CA (keep ca.key offline)
#   ctl-N.pem, ctl-N.key           each etcd member's server certificate (its address, 127.0.0.1)
#   client-HOST.pem, client-HOST.key   one client certificate per controller and worker machine
# Usage: make-certs.sh ctl-1=10.0.0.1 ctl-2=10.0.0.2 ctl-3=10.0.0.3 -- ctl-1 ctl-2 ctl-3 wrk-1 wrk-2
# Client certificates are named "hearth-client-HOST": never an etcd user's name, because etcd
# takes a client certificate's CN as the user when no password is given.
set -euo pipefail
out=etcd-pki
umask 077
mkdir -p "$out"
cd "$out"
members=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do members+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
clients=("$@")
[ ${#members[@]} -gt 0 ] || { echo "usage: $0 NAME=IP … -- HOST …" >&2; exit 2; }
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
if [ ! -f ca.pem ]; then
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 3650 -subj "/CN=Hearth etcd CA"
fi
sign() { # name cn extensions
    openssl req -new "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
        -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
for m in "${members[@]}"; do
    name=${m%%=*} ip=${m#*=}
    sign "$name" "$name" "extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:$ip,IP:127.0.0.1,DNS:localhost"
done
for h in "${clients[@]}"; do
    sign "client-$h" "hearth-client-$h" "extendedKeyUsage=clientAuth"
done
ls -l
