//! `hearth bench auth`: what checking an API key costs on the request path (issue 11 asks for
//! under 5 µs): the middleware's whole check, header to principal, for a tenant key, the
//! operator key and a wrong key, timed in batches on a throw-away key store.

use anyhow::{Context, Result};
use axum::http::{header, HeaderMap, HeaderValue};
use hearth_service::auth::{Auth, AuthSettings, Role, Scope};
use serde_json::json;
use std::time::Instant;

/// Times `checks` authentications per kind of key; prints ns per check (median of 5 batches).
pub fn run(checks: usize, as_json: bool) -> Result<()> {
    let dir =
        std::env::temp_dir().join(format!("hearth-bench-auth-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).context("creating a temporary key store")?;
    let result = measure(&dir, checks.max(1), as_json);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(dir: &std::path::Path, checks: usize, as_json: bool) -> Result<()> {
    let auth = Auth::open(AuthSettings {
        enabled: true,
        data_dir: dir,
        cluster_key: None,
        worker_secret: None,
    })?;
    let keys = auth.keys().context("no key store")?;
    // One namespace holding them all: lift its key limit for the measurement.
    keys.set_max_per_namespace(usize::MAX);
    // A store with many keys, as a busy platform has.
    for _ in 0..1000 {
        keys.create(Scope::Namespace("tenant".into()), Role::Invoke, "")?;
    }
    let (_, tenant) = keys.create(Scope::Namespace("team-a".into()), Role::Invoke, "")?;
    let operator = std::fs::read_to_string(dir.join(hearth_service::auth::ADMIN_KEY_FILE))?;
    let last = if tenant.ends_with('x') { 'y' } else { 'x' };
    let wrong = format!("{}{last}", &tenant[..tenant.len() - 1]);
    let mut out = serde_json::Map::new();
    for (name, token) in [
        ("tenant", tenant.as_str()),
        ("operator", operator.trim()),
        ("wrong", wrong.as_str()),
    ] {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}"))?,
        );
        let mut batches: Vec<f64> = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                for _ in 0..checks {
                    std::hint::black_box(auth.authenticate(std::hint::black_box(&h)).is_ok());
                }
                t0.elapsed().as_nanos() as f64 / checks as f64
            })
            .collect();
        batches.sort_by(f64::total_cmp);
        let ns = batches[2];
        if !as_json {
            println!("{name:<9} {ns:>8.0} ns per key check (median of 5 batches of {checks})");
        }
        out.insert(name.into(), json!(ns));
    }
    if as_json {
        println!("{}", serde_json::Value::Object(out));
    }
    Ok(())
}
