//! Runtime images: read-only root filesystems a sandbox's `/usr` and `/etc` come from, instead
//! of the host's (issue 32 §1). Each is stored once under its content digest and shared by
//! every sandbox of every worker on the host; a name (`python3.11`) points at one digest.
//!
//! Layout of the store (`runtime.store_dir`, default `/var/lib/hearth/runtimes`):
//! `<dir>/<hex>/rootfs/` (the file system), `<dir>/<hex>/runtime.json` ([`Runtime`]'s record)
//! and `<dir>/names/<name>` (a file holding `sha256:<hex>`). Images are immutable once stored.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The name a function's `runtime: "python3"` means unless the operator says otherwise.
pub const DEFAULT_RUNTIME: &str = "python3.11";
/// Where runtime images live unless the operator says otherwise: host-wide, because they are
/// immutable, large and the same for every worker.
pub const DEFAULT_STORE_DIR: &str = "/var/lib/hearth/runtimes";

/// One stored runtime image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runtime {
    /// The name it was built or imported under (`python3.11`).
    pub name: String,
    /// `sha256:<hex>` of its file tree ([`RuntimeStore`] says how it is computed).
    pub digest: String,
    /// Where it came from: `mmdebstrap <suite>` or `oci-archive`.
    #[serde(default)]
    pub source: String,
    /// Bytes of file content in its root filesystem.
    #[serde(default)]
    pub bytes: u64,
    /// The host directory of its root filesystem (not stored: derived from the store).
    #[serde(skip)]
    pub rootfs: PathBuf,
}

/// A `sha256:` digest's hex part, if it is one: 64 lowercase hex digits, so it is safe as a
/// file name.
pub fn digest_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(hex)
}

/// The store of runtime images on this host.
#[derive(Debug, Clone)]
pub struct RuntimeStore {
    dir: PathBuf,
}

impl RuntimeStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RuntimeStore { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn names_dir(&self) -> PathBuf {
        self.dir.join("names")
    }

    /// The runtime stored under `digest`, if it is complete (its record and root exist).
    pub fn by_digest(&self, digest: &str) -> Option<Runtime> {
        let hex = digest_hex(digest)?;
        let base = self.dir.join(hex);
        let text = std::fs::read(base.join("runtime.json")).ok()?;
        let mut rt: Runtime = serde_json::from_slice(&text).ok()?;
        if rt.digest != digest {
            return None;
        }
        rt.rootfs = base.join("rootfs");
        rt.rootfs.is_dir().then_some(rt)
    }

    /// The runtime a name (or a digest) stands for now.
    pub fn resolve(&self, name_or_digest: &str) -> Option<Runtime> {
        if digest_hex(name_or_digest).is_some() {
            return self.by_digest(name_or_digest);
        }
        if !hearth_api::function::valid_runtime_name(name_or_digest) {
            return None;
        }
        let digest = std::fs::read_to_string(self.names_dir().join(name_or_digest)).ok()?;
        self.by_digest(digest.trim())
    }

    /// Every named runtime, by name.
    pub fn list(&self) -> Vec<Runtime> {
        let Ok(entries) = std::fs::read_dir(self.names_dir()) else {
            return Vec::new();
        };
        let mut all: Vec<Runtime> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|name| {
                let mut rt = self.resolve(&name)?;
                rt.name = name;
                Some(rt)
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(name: &str, hex: &str) -> (tempfile::TempDir, RuntimeStore) {
        let t = tempfile::tempdir().unwrap();
        let s = RuntimeStore::new(t.path());
        let base = t.path().join(hex);
        std::fs::create_dir_all(base.join("rootfs/usr")).unwrap();
        let rt = Runtime {
            name: name.into(),
            digest: format!("sha256:{hex}"),
            source: "test".into(),
            bytes: 1,
            rootfs: PathBuf::new(),
        };
        std::fs::write(base.join("runtime.json"), serde_json::to_vec(&rt).unwrap()).unwrap();
        std::fs::create_dir_all(t.path().join("names")).unwrap();
        std::fs::write(t.path().join("names").join(name), &rt.digest).unwrap();
        (t, s)
    }

    #[test]
    fn names_and_digests_resolve_and_nothing_else_does() {
        let hex = "ab".repeat(32);
        let (t, s) = store_with("python3.11", &hex);
        let rt = s.resolve("python3.11").unwrap();
        assert_eq!(rt.digest, format!("sha256:{hex}"));
        assert_eq!(rt.rootfs, t.path().join(&hex).join("rootfs"));
        assert_eq!(s.resolve(&rt.digest).unwrap().name, "python3.11");
        assert_eq!(s.list().len(), 1);
        for bad in [
            "../names/python3.11",
            "sha256:AB",
            "",
            "python3.12",
            "names",
        ] {
            assert!(s.resolve(bad).is_none(), "{bad}");
        }
    }
}
