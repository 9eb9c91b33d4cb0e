//! A controller among several, sharing one cluster through the state store (etcd): it keeps
//! its local registry a copy of the cluster's (the invoke path reads only the copy), and it
//! finds the cluster's workers in the store's membership and polls them.
//!
//! Functions: a registration is stored in the cluster first, where it gets its cluster-wide
//! version (etcd's revision), then applied locally; every other controller applies it from its
//! watch. Code is content-addressed in the store and unpacked into each controller's data
//! directory once per version. A watch that starts over (a lost connection) starts with a
//! snapshot, which also removes what was deleted meanwhile.

use crate::facade::Controller;
use hearth_api::FunctionSpec;
use hearth_service::registry::CodeSource;
use hearth_service::store::{Change, FunctionRecord, MemberRecord};
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
            Change::Snapshot(all) => {
                let keys: HashSet<String> = all.iter().map(|r| r.key.clone()).collect();
                for r in all {
                    apply(&ctl, r).await;
                }
                for reg in ctl.registry().list() {
                    if !keys.contains(&reg.spec.name) {
                        ctl.forget_function(&reg.spec.name);
                    }
                }
            }
            Change::Put(r) => apply(&ctl, r).await,
            Change::Delete(key) => ctl.forget_function(&key),
        }
    }
}

/// One function record from the cluster, applied unless the local copy has that version.
pub(crate) async fn apply(ctl: &std::sync::Arc<Controller>, r: FunctionRecord) {
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
    let start = |m: &MemberRecord| {
        tokio::spawn(crate::membership::poll_worker(
            c.clone(),
            m.url.clone(),
            Some(m.incarnation.clone()),
        ))
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
                    let same = polls.get(&m.name).is_some_and(|(inc, _)| *inc == m.incarnation);
                    if !same {
                        if let Some((_, old)) = polls.insert(m.name.clone(), (m.incarnation.clone(), start(m))) {
                            old.abort();
                        }
                    }
                }
            }
            Change::Put(m) => {
                let same = polls.get(&m.name).is_some_and(|(inc, _)| *inc == m.incarnation);
                if !same {
                    tracing::info!(worker = %m.name, url = %m.url, "worker found in the cluster's membership");
                    if let Some((_, old)) = polls.insert(m.name.clone(), (m.incarnation.clone(), start(&m))) {
                        old.abort();
                    }
                }
            }
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
