"""The chaos suite's compromised-worker phase (issue 31, item 1).

`run(cluster, request, wait_for)` takes the running cluster of scripts/chaos.py and, holding one
worker's real credential file (its own `hw_` token and the controller's `hx_` token for it),
tries each attack that the old all-powerful cluster key allowed, over HTTP, at both controllers
and at the other workers. Every one must be refused, and afterwards every worker must still be
up at every controller. Returns the list of what broke (empty: everything held).
"""

import json
import os

REFUSED = (400, 401, 403, 404)


def _tokens(worker):
    lines = [l.strip() for l in open(worker.credential) if l.strip()]
    hw = next(l for l in lines if l.startswith("hw_"))
    hx = next(l for l in lines if l.startswith("hx_"))
    return hw, hx


def run(cluster, request, wait_for):
    me, other = cluster.workers[0], cluster.workers[1]
    hw, hx = _tokens(me)
    master = open(cluster.pki.cluster_key).read().strip()
    local_admin = open(os.path.join(me.data_dir, "admin.key")).read().strip()
    spec = json.dumps({"runtime": "python3", "sim_warm_ms": 1, "memory_mb": 64}).encode()
    report = json.dumps({"worker": other.id, "url": "http://127.0.0.1:9", "incarnation": "evil",
                         "backend": "sim", "load": {"load": 0.0}, "cpus": 1.0,
                         "shutting_down": False, "functions": {}, "seq": 1}).encode()
    attacks = []
    for c in cluster.controllers:
        n = c.name
        attacks += [
            (f"{n}: read a tenant's spec and env", c.url, "GET", "/v1/functions/work", hw, None, REFUSED),
            (f"{n}: list every function", c.url, "GET", "/v1/functions", hw, None, REFUSED),
            (f"{n}: create a * admin key", c.url, "POST", "/v1/keys", hw,
             json.dumps({"namespace": "*", "role": "admin"}).encode(), (403,)),
            (f"{n}: make a credential for another worker", c.url, "POST",
             "/v1/cluster/credentials", hw, json.dumps({"worker": "evil"}).encode(), (403,)),
            (f"{n}: replace a tenant's code", c.url, "PUT", "/v1/functions/work", hw, spec, REFUSED),
            (f"{n}: invoke on a tenant's behalf", c.url, "POST", "/v1/functions/work/invoke", hw,
             b"{}", REFUSED),
            (f"{n}: join a fake worker", c.url, "PUT", "/v1/cluster/workers/evil", hw,
             report.replace(other.id.encode(), b"evil"), (403,)),
            (f"{n}: take over another worker's id", c.url, "PUT",
             f"/v1/cluster/workers/{other.id}", hw, report, (403,)),
            (f"{n}: drive another worker out", c.url, "DELETE",
             f"/v1/cluster/workers/{other.id}", hw, None, (403,)),
            (f"{n}: read the cluster's status", c.url, "GET", "/v1/status", hw, None, (403,)),
            (f"{n}: the controller token of {me.id}", c.url, "GET", "/v1/status", hx, None, (401,)),
            (f"{n}: the controllers' cluster key", c.url, "GET", "/v1/status", master, None, (401,)),
        ]
    for w in cluster.workers[1:]:
        attacks += [
            (f"{w.id}: {me.id}'s controller token", w.url, "PUT", "/v1/functions/work", hx, spec, (401,)),
            (f"{w.id}: {me.id}'s worker credential", w.url, "POST", "/v1/functions/work/invoke", hw,
             b"{}", (401,)),
        ]
    attacks += [
        (f"{me.id}: manage keys with its controller token", me.url, "POST", "/v1/keys", hx,
         json.dumps({"namespace": "*", "role": "admin"}).encode(), (403,)),
        (f"{me.id}: replace a tenant's code with its own admin.key", me.url, "PUT",
         "/v1/functions/work", local_admin, spec, (403,)),
        (f"{me.id}: delete a tenant's function with its own admin.key", me.url, "DELETE",
         "/v1/functions/work", local_admin, None, (403,)),
    ]
    broken = []
    print(f"compromised worker {me.id}: {len(attacks)} attacks")
    for what, base, method, path, token, body, want in attacks:
        try:
            status, v = request(base, method, path, token, body=body)
        except OSError as e:
            status, v = None, str(e)
        ok = status in want
        print(f"  {'refused' if ok else 'WORKED '} {status}  {what}")
        if not ok:
            broken.append(f"compromised worker: {what} answered {status} {v}")
    # Nothing moved: every worker is still up at every controller, the tenant's function too.
    try:
        wait_for("every worker still up after the attacks",
                 lambda: all(cluster.up(c) == {w.id for w in cluster.workers}
                             for c in cluster.controllers), 10)
    except SystemExit as e:
        broken.append(f"compromised worker: {e}")
    status, _ = request(cluster.controllers[0].url, "POST", "/v1/functions/work/invoke",
                        cluster.key, body=b"{}")
    if status != 200:
        broken.append(f"compromised worker: the tenant's function answered {status} afterwards")
    return broken
