"""The chaos suite's etcd: secured as deploy/ sets it up, then attacked (issue 31).

`secure_setup(root)` makes a private CA, etcd's server certificate for 127.0.0.1, one client
certificate and a shared cluster.key (openssl, 0600 files) and `etcd_args` gives etcd TLS with
client-certificate authentication. `create_users(cluster)` turns etcd's authentication on with
the users and roles of deploy/etcd/setup-auth.sh: `controller` (read-write on /hearth/) and one
`worker-<id>` per worker (its own member key only). `controller_env` and `worker_env` are the
HEARTH_STORE_* settings of each.

`run(cluster, broken)` is the last phase: an attacker who knows only etcd's address (and can
reach it) tries to read the registry, env, async records and keys and to put a key record, over
plain HTTP, over TLS without a certificate, with a certificate of its own CA, and through etcd's
JSON gateway; then a worker's own etcd user tries the same. Each attempt must be refused; the
same request with the controller's credentials must work (so a refusal is a refusal, not a
typo). Finally it checks what etcd holds: secrets sealed, the cluster key absent.
"""

import base64
import json
import os
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request

PREFIX = "/hearth/"
SEALED = "hearth-sealed-v1:"


class Pki:
    def __init__(self, root):
        self.dir = os.path.join(root, "pki")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    def path(self, name):
        return os.path.join(self.dir, name)


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _leaf(pki, ca, name, cn, san=None):
    key, csr, pem = pki.path(f"{name}-key.pem"), pki.path(f"{name}.csr"), pki.path(f"{name}.pem")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={cn}")
    ext = pki.path(f"{name}.ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth,clientAuth\n")
        if san:
            f.write(f"subjectAltName={san}\n")
    _openssl("x509", "-req", "-in", csr, "-CA", pki.path(f"{ca}.pem"),
             "-CAkey", pki.path(f"{ca}-key.pem"), "-CAcreateserial", "-days", "2",
             "-extfile", ext, "-out", pem)
    os.chmod(key, 0o600)


def _ca(pki, name):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", pki.path(f"{name}-key.pem"), "-out", pki.path(f"{name}.pem"),
             "-days", "2", "-subj", f"/CN=Hearth chaos {name} {os.getpid()}")
    os.chmod(pki.path(f"{name}-key.pem"), 0o600)


def _private(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def secure_setup(root):
    """The PKI (CA, etcd's server certificate, a client certificate, a rogue CA and its client
    certificate), the passwords and the cluster.key every controller is given."""
    pki = Pki(root)
    _ca(pki, "ca")
    _leaf(pki, "ca", "server", "hearth chaos etcd", san="IP:127.0.0.1")
    _leaf(pki, "ca", "client", "hearth chaos client")
    _ca(pki, "rogue-ca")
    _leaf(pki, "rogue-ca", "rogue", "root")
    pki.passwords = {}
    pki.cluster_key = pki.path("cluster.key")
    _private(pki.cluster_key, f"hc_{secrets.token_hex(32)}\n")
    return pki


def etcd_args(pki):
    return ["--cert-file", pki.path("server.pem"), "--key-file", pki.path("server-key.pem"),
            "--trusted-ca-file", pki.path("ca.pem"), "--client-cert-auth"]


def _password(pki, user):
    if user not in pki.passwords:
        pki.passwords[user] = secrets.token_hex(16)
        _private(pki.path(f"{user}.password"), pki.passwords[user] + "\n")
    return pki.path(f"{user}.password")


def _store_env(pki, user):
    return {"HEARTH_STORE_CA": pki.path("ca.pem"), "HEARTH_STORE_CERT": pki.path("client.pem"),
            "HEARTH_STORE_KEY": pki.path("client-key.pem"), "HEARTH_STORE_USER": user,
            "HEARTH_STORE_PASSWORD_FILE": _password(pki, user)}


def controller_env(pki):
    return dict(_store_env(pki, "controller"), HEARTH_CLUSTER_KEY_FILE=pki.cluster_key)


def worker_env(pki, worker_id):
    return _store_env(pki, f"worker-{worker_id}")


def _etcdctl(endpoints, args, user=None, password=None, cert="client", ca=True, env=None,
             timeout=20):
    """etcdctl as a client with the given credentials; its CompletedProcess. A short
    `timeout` (an attacker's attempt) also shortens etcdctl's own."""
    wait = "1s" if timeout < 10 else "3s"
    argv = ["etcdctl", "--endpoints", endpoints, "--dial-timeout", wait,
            "--command-timeout", wait]
    if ca is True:
        argv += ["--cacert", env.path("ca.pem")]
    elif ca == "skip":
        argv += ["--insecure-skip-tls-verify"]
    if cert:
        argv += ["--cert", env.path(f"{cert}.pem"), "--key", env.path(f"{cert}-key.pem")]
    if user:
        argv += ["--user", f"{user}:{password}"]
    try:
        return subprocess.run(argv + args, capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=dict(os.environ, ETCDCTL_API="3"))
    except subprocess.TimeoutExpired:
        # etcdctl keeps retrying a connection it cannot make: refused as well.
        return subprocess.CompletedProcess(argv + args, 124, b"", b"timed out")


def _root(cluster, args):
    pki = cluster.pki
    r = _etcdctl(cluster.etcd_endpoints, args, user="root", password=pki.root_password, env=pki)
    if r.returncode != 0:
        raise SystemExit(f"chaos: etcdctl {args[:2]} as root failed: {r.stderr.decode()[:300]}")
    return r


def create_users(cluster, worker_ids):
    """Turns etcd's auth on with the users and roles deploy/etcd/setup-auth.sh creates."""
    pki, eps = cluster.pki, cluster.etcd_endpoints
    pki.root_password = secrets.token_hex(16)
    for args in (["user", "add", f"root:{pki.root_password}"],
                 ["user", "grant-role", "root", "root"]):
        r = _etcdctl(eps, args, env=pki)
        if r.returncode != 0:
            raise SystemExit(f"chaos: etcdctl {args[:2]}: {r.stderr.decode()[:300]}")
    r = _etcdctl(eps, ["auth", "enable"], env=pki)
    if r.returncode != 0:
        raise SystemExit(f"chaos: etcdctl auth enable: {r.stderr.decode()[:300]}")
    _password(pki, "controller")
    _root(cluster, ["user", "add", f"controller:{pki.passwords['controller']}"])
    _root(cluster, ["role", "add", "hearth-controller"])
    _root(cluster, ["role", "grant-permission", "--prefix=true", "hearth-controller",
                    "readwrite", PREFIX])
    _root(cluster, ["user", "grant-role", "controller", "hearth-controller"])
    for wid in worker_ids:
        user = f"worker-{wid}"
        _password(pki, user)
        _root(cluster, ["user", "add", f"{user}:{pki.passwords[user]}"])
        _root(cluster, ["role", "add", user])
        _root(cluster, ["role", "grant-permission", user, "readwrite",
                        f"{PREFIX}members/workers/{wid}"])
        _root(cluster, ["user", "grant-role", user, user])


def _gateway(endpoint, path, body, context):
    """etcd's JSON gateway (POST /v3/...); the HTTP status, or the error's name."""
    req = urllib.request.Request(endpoint + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=3, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except Exception as e:  # noqa: BLE001 -- a refused handshake is the expected outcome
        return type(e).__name__, b""


def _api(base, method, path, key, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def run(cluster, broken):
    """The plain-etcd attacker's phase; appends what got through to `broken`."""
    pki, eps = cluster.pki, cluster.etcd_endpoints
    first = eps.split(",")[0]
    host_port = first.split("//")[1]
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    key_record = json.dumps({"id": "evil", "role": "admin", "namespace": "*"})
    reads = {"registry": f"{PREFIX}functions/", "async records": f"{PREFIX}inv/",
             "keys": f"{PREFIX}docs/keys/", "everything": PREFIX}
    tries = []

    def attempt(who, what, result):
        refused = result != 0
        tries.append((who, what, "refused" if refused else "GOT THROUGH"))
        if not refused:
            broken.append(f"etcd attacker: {who} could {what}")

    # A canary secret in a function's env and in async arguments, through the API.
    canary = f"canary-{secrets.token_hex(8)}"
    api = cluster.controllers[0].url
    spec = {"runtime": "python3", "sim_warm_ms": 1, "memory_mb": 64, "env": {"CANARY": canary}}
    for method, path, body in (("PUT", "/v1/functions/etcd-canary", spec),
                               ("POST", "/v1/functions/etcd-canary/invoke?async=true",
                                {"card": canary})):
        status = _api(api, method, path, cluster.key, body)
        if status not in (200, 201, 202):
            broken.append(f"etcd attacker phase: {method} {path} answered {status}")

    # The controller's credentials work (the commands are right).
    ctl_pw = pki.passwords["controller"]
    r = _etcdctl(eps, ["get", "--prefix", "--keys-only", PREFIX], user="controller",
                 password=ctl_pw, env=pki)
    if r.returncode != 0:
        broken.append(f"etcd attacker phase: the controller's own read failed: "
                      f"{r.stderr.decode()[:200]}")

    attackers = [
        ("plain HTTP", dict(endpoints=f"http://{host_port}", ca=None, cert=None)),
        ("TLS without a certificate", dict(endpoints=eps, ca="skip", cert=None)),
        ("a certificate of its own CA (CN=root)", dict(endpoints=eps, ca="skip", cert="rogue")),
    ]
    # (Refused at the connection, so one read of everything stands for every read.)
    quick = 4
    for who, how in attackers:
        r = _etcdctl(how["endpoints"], ["get", "--prefix", PREFIX], cert=how["cert"],
                     ca=how["ca"], env=pki, timeout=quick)
        attempt(who, "read everything", r.returncode)
        r = _etcdctl(how["endpoints"], ["put", f"{PREFIX}docs/keys/evil", key_record],
                     cert=how["cert"], ca=how["ca"], env=pki, timeout=quick)
        attempt(who, "put a key record", r.returncode)
        r = _etcdctl(how["endpoints"], ["user", "add", "evil:evil", "--interactive=false"],
                     cert=how["cert"], ca=how["ca"], env=pki, timeout=quick)
        attempt(who, "add an etcd user", r.returncode)

    # etcd's JSON gateway, over TLS without a client certificate and over plain HTTP.
    no_verify = ssl.create_default_context()
    no_verify.check_hostname = False
    no_verify.verify_mode = ssl.CERT_NONE
    for who, base, ctx in (("the JSON gateway over TLS", f"https://{host_port}", no_verify),
                           ("the JSON gateway over plain HTTP", f"http://{host_port}", None)):
        status, body = _gateway(base, "/v3/kv/range",
                                {"key": b64(PREFIX), "range_end": b64(PREFIX[:-1] + "0")}, ctx)
        attempt(who, "read everything", 0 if status == 200 and b"kvs" in body else 1)
        status, _ = _gateway(base, "/v3/kv/put",
                             {"key": b64(f"{PREFIX}docs/keys/evil"), "value": b64(key_record)},
                             ctx)
        attempt(who, "put a key record", 0 if status == 200 else 1)

    # A worker's own etcd user (a compromised worker): its member key and nothing else. It
    # is connected and authenticated, so a refusal must be etcd's "permission denied" (a
    # timeout would prove nothing).
    def denied(r):
        return 1 if r.returncode != 0 and b"permission denied" in r.stderr else 0

    wid = cluster.workers[0].id
    user = f"worker-{wid}"
    for what, prefix in reads.items():
        r = _etcdctl(eps, ["get", "--prefix", prefix], user=user, password=pki.passwords[user],
                     env=pki, timeout=quick)
        attempt(f"worker {wid}'s etcd user", f"read {what}", denied(r))
    for what, key in (("put a key record", f"{PREFIX}docs/keys/evil"),
                      ("put a function", f"{PREFIX}functions/work"),
                      ("publish another worker", f"{PREFIX}members/workers/{cluster.workers[1].id}")):
        r = _etcdctl(eps, ["put", key, key_record], user=user, password=pki.passwords[user],
                     env=pki, timeout=quick)
        attempt(f"worker {wid}'s etcd user", what, denied(r))

    # What etcd holds, read as root: no env, arguments or key records in clear, no cluster key.
    r = _root(cluster, ["get", "--prefix", PREFIX, "-w", "json"])
    kvs = json.loads(r.stdout).get("kvs", [])
    token = open(pki.cluster_key).read().strip()
    sealed = clear = 0
    for kv in kvs:
        k = base64.b64decode(kv["key"]).decode(errors="replace")
        v = base64.b64decode(kv.get("value", "")).decode(errors="replace")
        if token in v:
            broken.append(f"etcd holds the cluster key in clear at {k}")
        if canary in v:
            broken.append(f"etcd holds an env value or async argument in clear at {k}")
        secret = any(k.startswith(PREFIX + p) for p in ("functions/", "inv/", "docs/keys/"))
        if secret or (k.startswith(PREFIX + "code/") and not k.endswith("/meta")):
            if v.startswith(SEALED):
                sealed += 1
            else:
                clear += 1
                broken.append(f"etcd holds {k} unsealed")
    if sealed == 0:
        broken.append("etcd attacker phase: no sealed record found (nothing was checked)")

    print(f"\n{'etcd attacker':<40}{'attempt':<28}{'outcome':>12}")
    for who, what, outcome in tries:
        print(f"{who:<40}{what:<28}{outcome:>12}")
    print(f"records in etcd: {len(kvs)}, sealed secrets: {sealed}, in clear: {clear}")
