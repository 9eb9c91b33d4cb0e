//! Removing layers no function uses any more (issue 32 §2.4): after an unregistration, an
//! update to other requirements, a build's end, and at start for orphans.

use super::LayerStore;
use crate::runtimes::digest_hex;
use std::collections::HashSet;

/// Removes every complete or unfinished layer directory of `store` whose digest is not in
/// `keep` (digests `sha256:<hex>`); blocking. Builds in progress write elsewhere (`.tmp-*`,
/// removed by the builder), and a layer being built is kept by the function that waits for it.
/// Returns how many were removed.
pub fn remove_unreferenced(store: &LayerStore, keep: &HashSet<String>) -> usize {
    let keep: HashSet<&str> = keep.iter().filter_map(|d| digest_hex(d)).collect();
    let Ok(entries) = std::fs::read_dir(store.dir()) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let is_layer = name.len() == 64
            && name
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !is_layer || keep.contains(name.as_str()) {
            continue;
        }
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => {
                removed += 1;
                tracing::info!(layer = %format!("sha256:{name}"), "removed an unused layer");
            }
            Err(err) => tracing::warn!(layer = %name, error = %err, "could not remove a layer"),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreferenced_layers_go() {
        let t = tempfile::tempdir().unwrap();
        let store = LayerStore::new(t.path());
        let (a, b) = ("ab".repeat(32), "cd".repeat(32));
        for d in [&a, &b, &".tmp-x".to_string(), &"names".to_string()] {
            std::fs::create_dir_all(t.path().join(d).join("site")).unwrap();
        }
        let keep = HashSet::from([format!("sha256:{a}")]);
        assert_eq!(remove_unreferenced(&store, &keep), 1);
        assert!(t.path().join(&a).is_dir());
        assert!(!t.path().join(&b).exists());
        assert!(t.path().join(".tmp-x").is_dir() && t.path().join("names").is_dir());
    }
}
