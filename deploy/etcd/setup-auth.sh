#!/usr/bin/env bash
# Turns on etcd's users and roles for Hearth (etcd 3.4), once, on ctl-1, after the three
# members are up with client TLS (etcd.default.example). Creates:
#   root                     etcd's administrator (etcdctl for backups and maintenance)
#   hearth-controller        read-write on /hearth/ (every controller uses this user)
#   <worker_id>              per worker, named after it: read-write on its own member key
#                            /hearth/members/workers/<worker_id> and nothing else
# and writes each password to ./etcd-passwords/<user>.password (0600) for you to install as
# the controllers' and workers' store_password_file. Usage:
#   setup-auth.sh worker-1 worker-2 …        (the workers' worker_id values)
# Adding a worker later: setup-auth.sh --add worker-3 (needs etcd-passwords/root.password).
# Removing one: etcdctl … --user root user delete worker-3 && … role delete worker-3.
set -euo pipefail
export ETCDCTL_API=3
ETCD=${ETCD:-https://10.0.0.1:2379,https://10.0.0.2:2379,https://10.0.0.3:2379}
PKI=${PKI:-/etc/etcd/pki}
tls=(--endpoints "$ETCD" --cacert "$PKI/ca.pem" --cert "$PKI/client-$(hostname -s).pem"
     --key "$PKI/client-$(hostname -s).key")
umask 077
mkdir -p etcd-passwords
newpw() { head -c 24 /dev/urandom | base64 | tr -d '/+=' > "etcd-passwords/$1.password"; }
pw() { cat "etcd-passwords/$1.password"; }
as_root() { etcdctl "${tls[@]}" --user "root:$(pw root)" "$@"; }
add_user() { # user
    newpw "$1"
    # --interactive=false reads the password from the argument; it is not logged by etcd.
    as_root user add "$1:$(pw "$1")" --interactive=false
}
add_worker() { # worker_id: also its etcd user and role
    case "$1" in
        root|hearth-controller|*/*|"") echo "bad worker_id: $1" >&2; exit 2 ;;
    esac
    add_user "$1"
    as_root role add "$1"
    # The member key itself, not a prefix: worker-1 must not write worker-10's key.
    as_root role grant-permission "$1" readwrite "/hearth/members/workers/$1"
    as_root user grant-role "$1" "$1"
}
if [ "${1:-}" = "--add" ]; then
    shift
    for w in "$@"; do add_worker "$w"; done
    exit 0
fi
newpw root
etcdctl "${tls[@]}" user add "root:$(pw root)" --interactive=false
etcdctl "${tls[@]}" user grant-role root root
add_user hearth-controller
as_root role add hearth-controller
as_root role grant-permission --prefix=true hearth-controller readwrite /hearth/
as_root user grant-role hearth-controller hearth-controller
for w in "$@"; do add_worker "$w"; done
etcdctl "${tls[@]}" auth enable
as_root user list
as_root role get hearth-controller
echo "passwords in $(pwd)/etcd-passwords: keep root.password with the admins only"
