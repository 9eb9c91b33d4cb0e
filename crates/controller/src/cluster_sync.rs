//! A controller among several, sharing one cluster through the state store (etcd): it keeps
//! its local registry a copy of the cluster's (the invoke path reads only the copy), and it
//! finds the cluster's workers in the store's membership and polls them.
//!
//! Functions: a registration is stored in the cluster first, where it gets its cluster-wide
//! version (etcd's revision), then applied locally; every other controller applies it from its
//! watch. Code is content-addressed in the store and unpacked into each controller's data
//! directory once per version. A watch that starts over (a lost connection) starts with a
//! snapshot, which also removes what was deleted meanwhile.

use crate::config::ControllerConfig;
use crate::errors::StartError;
use crate::facade::Controller;
use hearth_api::FunctionSpec;
use hearth_service::auth::{Auth, ClusterKey, KeyRecord};
use hearth_service::registry::CodeSource;
use hearth_service::store::{Change, FunctionRecord, MemberRecord};
use hearth_service::store::{ClusterState, Doc, StoreError};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Applies the cluster's functions to the local registry, for as long as the controller lives.
pub(crate) async fn follow_functions(
    c: Weak<Controller>,
    mut changes: mpsc::Receiver<Change<FunctionRecord>>,
) {
    while let Some(change) = changes.recv().await {
        let Some(ctl) = c.upgrade() else { return };
        match change {
            Change::Snapshot(all) => apply_snapshot(&ctl, all).await,
            Change::Put(r) => apply(&ctl, r).await,
            Change::Delete(key) => ctl.forget_function(&key),
        }
    }
}

/// Every function the cluster has, applied; local ones it does not have go (deleted while
/// this controller was not watching).
pub(crate) async fn apply_snapshot(ctl: &std::sync::Arc<Controller>, all: Vec<FunctionRecord>) {
    let keys: HashSet<String> = all.iter().map(|r| r.key.clone()).collect();
    for r in all {
        apply(ctl, r).await;
    }
    for reg in ctl.registry().list() {
        if !keys.contains(&reg.spec.name) {
            ctl.forget_function(&reg.spec.name);
        }
    }
}

/// One function record from the cluster, applied unless the local copy has that version.
async fn apply(ctl: &std::sync::Arc<Controller>, r: FunctionRecord) {
    if ctl
        .registry()
        .get(&r.key)
        .is_some_and(|local| local.spec.version == r.version)
    {
        return;
    }
    let mut spec: FunctionSpec = match serde_json::from_value(r.spec.clone()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(function = %r.key, error = %e, "skipping an unreadable function record from the store");
            return;
        }
    };
    spec.name = r.key.clone();
    let code = match &r.code {
        Some(code_ref) if ctl.local_code_ref(&r.key).as_ref() != Some(code_ref) => {
            match ctl.cluster_code(code_ref).await {
                Ok(archive) => Some((code_ref.clone(), CodeSource::Archive(archive))),
                Err(e) => {
                    tracing::warn!(function = %r.key, error = %e, "cannot read a function's code from the store");
                    return;
                }
            }
        }
        _ => None,
    };
    if let Err(e) = ctl.apply_function(spec, code, r.version).await {
        tracing::warn!(function = %r.key, error = %e, "cannot apply a function from the store");
    }
}

/// Polls the workers the store's membership lists, for as long as the controller lives; one
/// whose lease ends leaves the ring.
pub(crate) async fn follow_workers(
    c: Weak<Controller>,
    mut changes: mpsc::Receiver<Change<MemberRecord>>,
) {
    let mut polls: HashMap<String, (String, JoinHandle<()>)> = HashMap::new();
    // A member not polled yet, or under a new incarnation, gets a poll of its own.
    let track = |polls: &mut HashMap<String, (String, JoinHandle<()>)>, m: &MemberRecord| {
        if polls
            .get(&m.name)
            .is_some_and(|(inc, _)| *inc == m.incarnation)
        {
            return;
        }
        tracing::info!(worker = %m.name, url = %m.url, "worker found in the cluster's membership");
        let task = tokio::spawn(crate::membership::poll_worker(
            c.clone(),
            m.url.clone(),
            Some((m.name.clone(), m.incarnation.clone())),
        ));
        if let Some((_, old)) = polls.insert(m.name.clone(), (m.incarnation.clone(), task)) {
            old.abort();
        }
    };
    while let Some(change) = changes.recv().await {
        let Some(ctl) = c.upgrade() else { break };
        match change {
            Change::Snapshot(all) => {
                let names: HashSet<&str> = all.iter().map(|m| m.name.as_str()).collect();
                polls.retain(|name, (_, task)| {
                    let keep = names.contains(name.as_str());
                    if !keep {
                        task.abort();
                        ctl.worker_lease_ended(name);
                    }
                    keep
                });
                for m in &all {
                    track(&mut polls, m);
                }
            }
            Change::Put(m) => track(&mut polls, &m),
            Change::Delete(name) => {
                if let Some((_, task)) = polls.remove(&name) {
                    task.abort();
                }
                ctl.worker_lease_ended(&name);
            }
        }
    }
    for (_, (_, task)) in polls {
        task.abort();
    }
}

/// The kind of shared document the cluster's settings are.
const CONFIG_KIND: &str = "config";

/// The id of the cluster setting that holds the SHA-256 fingerprint of the cluster key.
pub(crate) const KEY_FINGERPRINT_ID: &str = "cluster-key-sha256";
/// Where versions before issue 31 kept the cluster key itself, in clear: deleted on sight.
const LEGACY_KEY_ID: &str = "cluster-key";

/// Checks this controller's cluster key against the cluster's: every controller is given the
/// same `cluster.key` file by the operator, and etcd keeps only its fingerprint (the first
/// controller's). A controller with another key refuses to start: it would split the cluster
/// and could not open the records the others sealed. A key left in etcd by an older version
/// is deleted.
pub(crate) async fn settle_cluster_key(
    cluster: &dyn ClusterState,
    local: &ClusterKey,
) -> Result<(), StartError> {
    let mine = hearth_service::store::seal::key_fingerprint(local.token());
    // An older version's cluster: its key, in clear, is the one this controller must have.
    let mut settings = cluster.watch_docs(CONFIG_KIND);
    let snapshot = tokio::time::timeout(std::time::Duration::from_secs(10), settings.recv()).await;
    drop(settings);
    if let Ok(Some(Change::Snapshot(docs))) = snapshot {
        let legacy = docs.iter().find(|d| d.id == LEGACY_KEY_ID);
        if let Some(token) = legacy.and_then(|d| d.value["token"].as_str()) {
            if hearth_service::store::seal::key_fingerprint(token) != mine {
                return Err(StartError::Store(StoreError::Config(
                    "this controller's cluster key differs from the key an older version \
                     stored in etcd: give every controller that cluster.key \
                     (cluster_key_file)"
                        .into(),
                )));
            }
        }
    }
    let stored = cluster
        .put_doc_if_absent(CONFIG_KIND, KEY_FINGERPRINT_ID, &json!({ "sha256": mine }))
        .await?;
    let Some(theirs) = stored["sha256"].as_str() else {
        return Err(StartError::Store(StoreError::Corrupt {
            what: "cluster key fingerprint",
            why: "no sha256".into(),
        }));
    };
    if theirs != mine {
        return Err(StartError::Store(StoreError::Config(
            "this controller's cluster key differs from the cluster's (the fingerprint in etcd \
             is another key's): give every controller the same cluster.key file \
             (cluster_key_file)"
                .into(),
        )));
    }
    if cluster.delete_doc(CONFIG_KIND, LEGACY_KEY_ID).await? {
        tracing::warn!("deleted the cluster key an older version had stored in etcd in clear");
    }
    Ok(())
}

/// The balancing policy and its parameters: the first controller's, so that every controller
/// sends a function to the same home worker.
pub(crate) async fn settle_balance(
    cluster: &dyn ClusterState,
    config: &mut ControllerConfig,
) -> Result<(), StartError> {
    let mine = json!({ "balance": config.balance, "balance_params": config.balance_params });
    let stored = cluster
        .put_doc_if_absent(CONFIG_KIND, "balance", &mine)
        .await?;
    if stored == mine {
        return Ok(());
    }
    match (
        serde_json::from_value(stored["balance"].clone()),
        serde_json::from_value(stored["balance_params"].clone()),
    ) {
        (Ok(balance), Ok(params)) => {
            tracing::warn!(
                stored = %stored["balance"],
                "this controller's balancing settings differ from the cluster's: using the cluster's"
            );
            config.balance = balance;
            config.balance_params = params;
            Ok(())
        }
        _ => Err(StartError::Store(StoreError::Corrupt {
            what: "balancing settings",
            why: "unreadable".into(),
        })),
    }
}

/// Keeps the local key store a copy of the cluster's keys. The key made at this controller's
/// first start is published (so its admin.key works on every controller); any other local key
/// the cluster does not have was deleted meanwhile and goes.
pub(crate) async fn follow_keys(
    auth: std::sync::Arc<Auth>,
    cluster: std::sync::Arc<dyn ClusterState>,
    mut changes: mpsc::Receiver<Change<Doc>>,
) {
    let Some(keys) = auth.keys() else { return };
    let apply = |d: &Doc| match serde_json::from_value::<KeyRecord>(d.value.clone()) {
        Ok(r) => {
            if let Err(e) = keys.apply(&r) {
                tracing::warn!(key = %d.id, error = %e, "cannot apply a key from the cluster");
            }
        }
        Err(_) => tracing::warn!(key = %d.id, "unreadable key record in the cluster's store"),
    };
    let mut published = false;
    while let Some(change) = changes.recv().await {
        match change {
            Change::Snapshot(all) => {
                let ids: HashSet<String> = all.iter().map(|d| d.id.clone()).collect();
                for d in &all {
                    apply(d);
                }
                for id in keys.ids() {
                    if ids.contains(&id) {
                        continue;
                    }
                    let mine = !published && auth.made_at_start() == Some(id.as_str());
                    if mine {
                        if let Some(r) = keys.record(&id) {
                            let doc = serde_json::to_value(&r).unwrap_or_default();
                            match cluster
                                .put_doc(hearth_service::keys_api::KEYS_KIND, &id, &doc)
                                .await
                            {
                                Ok(()) => published = true,
                                Err(e) => {
                                    tracing::warn!(error = %e, "cannot publish this controller's first key")
                                }
                            }
                        }
                    } else if let Err(e) = keys.revoke(&id) {
                        tracing::warn!(key = %id, error = %e, "cannot remove a key the cluster deleted");
                    }
                }
            }
            Change::Put(d) => apply(&d),
            Change::Delete(id) => {
                if let Err(e) = keys.revoke(&id) {
                    tracing::warn!(key = %id, error = %e, "cannot remove a key the cluster deleted");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_service::store::etcd::EtcdStore;
    use hearth_service::store::local_etcd::{etcd_for_tests, LocalEtcd};

    fn key(dir: &std::path::Path, name: &str, token: &str) -> ClusterKey {
        let path = dir.join(name);
        std::fs::write(&path, format!("{token}\n")).unwrap();
        ClusterKey::read(&path).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_cluster_key_is_checked_against_its_fingerprint_and_never_stored() {
        if !etcd_for_tests() {
            return;
        }
        let mut etcd = LocalEtcd::start(1).unwrap();
        etcd.wait_ready().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ours = key(dir.path(), "a", "hc_the_clusters_own_key_0123456789abcdef");
        let other = key(dir.path(), "b", "hc_another_clusters_key_0123456789abcdef");

        // An older version's cluster kept the key in clear: another key is refused, the
        // same one is accepted and the clear copy deleted.
        let store = EtcdStore::connect(&etcd.http_endpoints(), "/hearth", 1000)
            .await
            .unwrap();
        store
            .put_doc(
                CONFIG_KIND,
                LEGACY_KEY_ID,
                &json!({ "token": ours.token() }),
            )
            .await
            .unwrap();
        let e = settle_cluster_key(store.as_ref(), &other)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("older version"), "{e}");
        settle_cluster_key(store.as_ref(), &ours).await.unwrap();
        settle_cluster_key(store.as_ref(), &ours).await.unwrap();
        let e = settle_cluster_key(store.as_ref(), &other)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("differs from the cluster's"), "{e}");
        assert!(!e.to_string().contains(other.token()));

        let dump = etcd.dump("/hearth/").await.unwrap();
        let keys: Vec<&str> = dump.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["/hearth/docs/config/cluster-key-sha256"]);
        let value = String::from_utf8_lossy(&dump[0].1);
        assert!(!value.contains(ours.token()), "{value}");
        assert!(
            value.contains(&hearth_service::store::seal::key_fingerprint(ours.token())),
            "{value}"
        );
        store.close().await;
    }
}
