//! Dependency layers: the packages of a function's `requirements.txt`, installed by Hearth
//! into a directory keyed by (runtime digest, normalized requirements), built once and mounted
//! read-only into every sandbox of every function that needs the same set (issue 32 §2).
//!
//! Layout (`<data>/layers`): `<dir>/<hex>/site/` (what goes on the handler's `sys.path`, with
//! bytecode compiled at build time) and `<dir>/<hex>/layer.json` ([`Layer`]'s record). A layer
//! directory is complete once its record exists; it is never changed afterwards.

pub mod build;
pub mod gc;
pub mod proxy;
pub mod requirements;

use crate::runtimes::digest_hex;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where a layer's packages appear inside a sandbox (on `sys.path` before the code).
pub const DEPS_MOUNT: &str = "/hearth/deps";

/// One built layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// `sha256:<hex>` of (runtime digest, normalized requirements).
    pub digest: String,
    /// The runtime it was built with (its packages' ABI).
    pub runtime_digest: String,
    /// The normalized requirements it holds, one per line.
    pub requirements: String,
    /// Bytes of file content on disk.
    pub bytes: u64,
    /// Top-level modules its packages provide (from each distribution's `top_level.txt` or
    /// `RECORD`): what a pre-imported sandbox imports before it is needed.
    #[serde(default)]
    pub modules: Vec<String>,
    /// The host directory of its `site/` (not stored: derived from the store).
    #[serde(skip)]
    pub site_dir: PathBuf,
}

/// The layers of one worker.
#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
}

impl LayerStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        LayerStore { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes on disk of the complete layer `digest` (its record's count), for the
    /// namespaces' layer quota.
    pub fn bytes_of(&self, digest: &str) -> Option<u64> {
        self.get(digest).map(|l| l.bytes)
    }

    /// The complete layer stored under `digest`, if any.
    pub fn get(&self, digest: &str) -> Option<Layer> {
        let hex = digest_hex(digest)?;
        let base = self.dir.join(hex);
        let text = std::fs::read(base.join("layer.json")).ok()?;
        let mut layer: Layer = serde_json::from_slice(&text).ok()?;
        if layer.digest != digest {
            return None;
        }
        layer.site_dir = base.join("site");
        layer.site_dir.is_dir().then_some(layer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_complete_layer_under_its_own_digest_is_found() {
        let t = tempfile::tempdir().unwrap();
        let s = LayerStore::new(t.path());
        let hex = "cd".repeat(32);
        let digest = format!("sha256:{hex}");
        assert!(s.get(&digest).is_none());
        std::fs::create_dir_all(t.path().join(&hex).join("site")).unwrap();
        assert!(s.get(&digest).is_none(), "no record yet: still building");
        let layer = Layer {
            digest: digest.clone(),
            runtime_digest: format!("sha256:{}", "ef".repeat(32)),
            requirements: "numpy==2.0.0\n".into(),
            bytes: 10,
            modules: vec!["numpy".into()],
            site_dir: PathBuf::new(),
        };
        std::fs::write(
            t.path().join(&hex).join("layer.json"),
            serde_json::to_vec(&layer).unwrap(),
        )
        .unwrap();
        let got = s.get(&digest).unwrap();
        assert_eq!(got.modules, ["numpy"]);
        assert_eq!(got.site_dir, t.path().join(&hex).join("site"));
        assert!(s.get("sha256:../x").is_none());
    }
}
