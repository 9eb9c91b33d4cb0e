//! Pre-imported generic sandboxes on runc (issue 32): the three paths a cold start of a function
//! with a dependency layer can take, timed as the worker times a cold start's init, against the
//! host's own import of the same modules.
//!
//! * fresh: a sandbox created from nothing (its handler imports everything);
//! * generic: a generic sandbox with the layer mounted but nothing imported, specialized;
//! * pre-imported: a generic sandbox whose agent imported the layer's modules before it was
//!   ready, specialized (the handler's imports are `sys.modules` lookups).
//!
//! Without the network it uses a generated package of 300 modules. With
//! `HEARTH_BENCH_SITE=DIR` (e.g. a `pip install --target` of numpy and Pillow, bytecode compiled)
//! and `HEARTH_BENCH_IMPORT=numpy,PIL.Image` it measures those instead and prints the numbers
//! for docs/sandboxes.md (`HEARTH_BENCH_ROUNDS`, default 5). Needs root and runc; without them
//! it says why and passes, unless `HEARTH_REQUIRE_RUNC=1`.

mod common;

use hearth_api::FunctionSpec;
use hearth_core::SandboxId;
use hearth_worker::backend::runc::RuncBackend;
use hearth_worker::config::RuncConfig;
use hearth_worker::layers::Layer;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A layer record in the store's layout, its `site/` a link to `site` (or `site` itself).
fn store_layer(store: &Path, hex: &str, site: &Path, modules: &[&str]) -> String {
    let digest = format!("sha256:{hex}");
    let base = store.join(hex);
    std::fs::create_dir_all(&base).unwrap();
    std::os::unix::fs::symlink(site, base.join("site")).unwrap();
    let layer = Layer {
        digest: digest.clone(),
        runtime_digest: format!("sha256:{}", "ab".repeat(32)),
        requirements: "bench\n".into(),
        bytes: 1,
        modules: modules.iter().map(ToString::to_string).collect(),
        site_dir: PathBuf::new(),
    };
    std::fs::write(base.join("layer.json"), serde_json::to_vec(&layer).unwrap()).unwrap();
    digest
}

/// A package whose import takes tens of ms: 300 modules of 20 functions each.
fn slow_package(site: &Path) {
    let pkg = site.join("slowpkg");
    std::fs::create_dir_all(&pkg).unwrap();
    let mut init = String::new();
    for i in 0..300 {
        init.push_str(&format!("from . import m{i}\n"));
        let body: String = (0..20)
            .map(|j| format!("def f{j}(x):\n    return x + {j}\n"))
            .collect();
        std::fs::write(pkg.join(format!("m{i}.py")), format!("V = {i}\n{body}")).unwrap();
    }
    std::fs::write(pkg.join("__init__.py"), init).unwrap();
}

fn world_readable(dir: &Path) {
    let mode = if dir.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    if dir.is_dir() {
        for e in std::fs::read_dir(dir).unwrap() {
            world_readable(&e.unwrap().path());
        }
    }
}

/// The host's own import of `modules` with `site` first on `sys.path`, timed in-process, µs.
fn host_import_us(site: &Path, modules: &str) -> u64 {
    let script = format!(
        "import sys, time\nsys.path.insert(0, sys.argv[1])\nt = time.perf_counter()\nimport {modules}\nprint(int((time.perf_counter() - t) * 1e6))\n"
    );
    let o = std::process::Command::new("/usr/bin/python3")
        .args(["-I", "-S", "-c", &script])
        .arg(site)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

fn p(v: &mut [u64], q: f64) -> f64 {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * q / 100.0).round() as usize;
    v[i] as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preimported_sandbox_leaves_only_the_specialization_on_the_cold_path() {
    if !common::runc_available(&["/sys/fs/cgroup/freezer", "/usr/bin/python3"]) {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("hpre")
        .tempdir_in("/tmp")
        .unwrap();
    let (site, modules) = match (
        std::env::var("HEARTH_BENCH_SITE"),
        std::env::var("HEARTH_BENCH_IMPORT"),
    ) {
        (Ok(site), Ok(modules)) => (PathBuf::from(site), modules),
        _ => {
            let site = tmp.path().join("site");
            slow_package(&site);
            world_readable(&site);
            (site, "slowpkg".to_string())
        }
    };
    let rounds: usize = std::env::var("HEARTH_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let top: Vec<&str> = modules
        .split(',')
        .map(|m| m.split('.').next().unwrap())
        .collect();
    let data = tmp.path().join("d");
    let store = data.join("layers");
    // The same packages as two layers: one mounted only, one pre-imported.
    let mounted = store_layer(&store, &"1a".repeat(32), &site, &[]);
    let preimported = store_layer(&store, &"2b".repeat(32), &site, &top);
    let code = tmp.path().join("code");
    std::fs::create_dir(&code).unwrap();
    std::fs::write(
        code.join("main.py"),
        format!("import {modules}\n\ndef main(args):\n    return {{\"ok\": True}}\n"),
    )
    .unwrap();
    world_readable(tmp.path());
    world_readable(&code);
    let b = RuncBackend::new(
        RuncConfig::default(),
        &data,
        &format!("pre{}", std::process::id()),
        1 << 20,
        false,
    )
    .await
    .unwrap();
    let spec = |layer: &str| {
        let mut s = FunctionSpec::new("f");
        s.memory_mb = 256;
        s.layer = Some(layer.to_string());
        s
    };
    let (mut fresh, mut generic, mut pre, mut host) = (vec![], vec![], vec![], vec![]);
    let mut id = 0;
    let mut next = || {
        id += 1;
        SandboxId(id)
    };
    for _ in 0..rounds {
        // fresh
        let t = Instant::now();
        let mut sb = b.create(next(), &spec(&mounted), &code).await.unwrap();
        fresh.push(t.elapsed().as_micros() as u64);
        assert_eq!(b.invoke(&mut sb, b"{}").await.unwrap().status, 200);
        b.destroy(sb).await;
        // generic (layer mounted, nothing imported) and pre-imported: made first (off the cold
        // path, as the pool does), then specialized; only the specialization is timed.
        for (layer, out) in [(&mounted, &mut generic), (&preimported, &mut pre)] {
            let g = b
                .create_generic(next(), 256, None, Some(layer))
                .await
                .unwrap();
            let t = Instant::now();
            let mut sb = b.specialize(g, &spec(layer), &code).await.unwrap();
            out.push(t.elapsed().as_micros() as u64);
            assert_eq!(b.invoke(&mut sb, b"{}").await.unwrap().status, 200);
            b.destroy(sb).await;
        }
        host.push(host_import_us(&site, &modules));
    }
    b.cleanup_all().await;
    let (f50, g50, p50, h50) = (
        p(&mut fresh, 50.0),
        p(&mut generic, 50.0),
        p(&mut pre, 50.0),
        p(&mut host, 50.0),
    );
    println!(
        "{modules}, {rounds} rounds, init ms p50/p99: fresh {f50:.1}/{:.1}  generic {g50:.1}/{:.1}  \
         pre-imported {p50:.1}/{:.1}  host import {h50:.1}/{:.1}  generic/host {:.2}",
        p(&mut fresh, 99.0),
        p(&mut generic, 99.0),
        p(&mut pre, 99.0),
        p(&mut host, 99.0),
        g50 / h50
    );
    // The import left the cold path: a pre-imported specialization is far shorter than a
    // generic one that imports, and than a fresh start.
    assert!(p50 < g50 && g50 < f50, "{p50} {g50} {f50}");
}
