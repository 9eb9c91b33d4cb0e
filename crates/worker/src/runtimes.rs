//! Runtime images: read-only root filesystems a sandbox's `/usr` and `/etc` come from, instead
//! of the host's (issue 32 §1). Each is stored once under its content digest and shared by
//! every sandbox of every worker on the host; a name (`python3.11`) points at one digest.
//!
//! Layout of the store (`runtime.store_dir`, default `/var/lib/hearth/runtimes`):
//! `<dir>/<hex>/rootfs/` (the file system), `<dir>/<hex>/runtime.json` ([`Runtime`]'s record)
//! and `<dir>/names/<name>` (a file holding `sha256:<hex>`). Images are immutable once stored.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The name a function's `runtime: "python3"` means unless the operator says otherwise.
pub const DEFAULT_RUNTIME: &str = "python3.11";
/// Where runtime images live unless the operator says otherwise: host-wide, because they are
/// immutable, large and the same for every worker.
pub const DEFAULT_STORE_DIR: &str = "/var/lib/hearth/runtimes";

/// Debian's mirror `hearth runtime build` takes packages from unless told otherwise.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// The Debian release a runtime is built from unless told otherwise (its python3 is 3.11).
pub const DEFAULT_SUITE: &str = "bookworm";
/// What a Python runtime holds beyond Debian's essential packages: pip for the dependency
/// build sandbox, the C++ and OpenMP runtimes that numpy/scikit-learn wheels link against,
/// and CA certificates for an HTTPS package index.
pub const PYTHON_PACKAGES: &str = "python3,python3-pip,libstdc++6,libgomp1,ca-certificates";
/// Parts of a built tree no sandbox needs (documentation, manuals, translations, apt's
/// caches): dropped before the digest is taken.
const TRIM: [&str; 6] = [
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/lib/apt/lists",
    "var/cache",
];

/// Why a runtime operation failed. Messages name no host path beyond the store itself.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime name must be 1-32 characters of [a-z0-9._-], starting with a letter: {0:?}")]
    BadName(String),
    #[error("no runtime named {0:?} (see `hearth runtime list`)")]
    Unknown(String),
    #[error("runtime {name:?} is used by {count} registered function(s): remove or re-register them first")]
    InUse { name: String, count: usize },
    #[error("the image has no /usr/bin/python3: not a Python runtime")]
    NoPython,
    #[error("{tool} failed: {detail}")]
    Tool { tool: &'static str, detail: String },
    #[error("the image archive is not usable: {0}")]
    BadArchive(String),
    #[error("runtime store: {0}")]
    Io(#[from] std::io::Error),
}

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

    /// Builds a Python runtime from Debian's packages with `mmdebstrap` and stores it under
    /// `name`. Blocking (tens of seconds): call it off the async threads.
    pub fn build(&self, name: &str, suite: &str, mirror: &str) -> Result<Runtime, RuntimeError> {
        check_name(name)?;
        let safe = |s: &str| {
            !s.is_empty()
                && s.len() <= 256
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._:/".contains(&b))
        };
        if !safe(suite) || !safe(mirror) || !mirror.starts_with("http") {
            return Err(RuntimeError::Tool {
                tool: "mmdebstrap",
                detail: "suite and mirror must be plain names and an http(s) URL".into(),
            });
        }
        let tmp = self.temp_dir()?;
        let rootfs = tmp.path().join("rootfs");
        let out = Command::new("mmdebstrap")
            .args(["--variant=essential", "--mode=root", "--quiet"])
            .arg(format!("--include={PYTHON_PACKAGES}"))
            .arg(suite)
            .arg(&rootfs)
            .arg(mirror)
            .output()
            .map_err(|e| RuntimeError::Tool {
                tool: "mmdebstrap",
                detail: format!("cannot run it ({e}): apt-get install mmdebstrap"),
            })?;
        if !out.status.success() {
            return Err(RuntimeError::Tool {
                tool: "mmdebstrap",
                detail: tail(&out.stderr),
            });
        }
        for t in TRIM {
            let p = rootfs.join(t);
            if p.is_dir() {
                std::fs::remove_dir_all(&p)?;
                std::fs::create_dir(&p)?;
            }
        }
        self.store_tree(name, tmp, &format!("mmdebstrap {suite}"))
    }

    /// Imports an OCI image archive (a tar of an OCI image layout, as `skopeo copy …
    /// oci-archive:FILE` writes) as runtime `name`: its layers are unpacked with `umoci`.
    pub fn import(&self, name: &str, archive: &Path) -> Result<Runtime, RuntimeError> {
        check_name(name)?;
        let tmp = self.temp_dir()?;
        let layout = tmp.path().join("layout");
        std::fs::create_dir(&layout)?;
        let file = std::fs::File::open(archive)
            .map_err(|e| RuntimeError::BadArchive(format!("cannot open it: {}", e.kind())))?;
        let mut tar = tar::Archive::new(file);
        tar.set_preserve_permissions(false);
        tar.set_unpack_xattrs(false);
        // `unpack` refuses entries that would land outside `layout`.
        tar.unpack(&layout)
            .map_err(|e| RuntimeError::BadArchive(format!("not a tar archive ({})", e.kind())))?;
        let index: serde_json::Value = std::fs::read(layout.join("index.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| RuntimeError::BadArchive("no OCI index.json".into()))?;
        let tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .filter(|t| {
                !t.is_empty()
                    && t.len() <= 128
                    && t.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            })
            .ok_or_else(|| RuntimeError::BadArchive("its index names no image tag".into()))?
            .to_string();
        let rootfs = tmp.path().join("unpacked");
        let out = Command::new("umoci")
            .args(["raw", "unpack", "--image"])
            .arg(format!("{}:{tag}", layout.display()))
            .arg(&rootfs)
            .output()
            .map_err(|e| RuntimeError::Tool {
                tool: "umoci",
                detail: format!("cannot run it ({e}): apt-get install umoci"),
            })?;
        if !out.status.success() {
            // umoci's message names the temporary paths: say only that it failed.
            return Err(RuntimeError::BadArchive(
                "umoci could not unpack its layers".into(),
            ));
        }
        std::fs::rename(&rootfs, tmp.path().join("rootfs"))?;
        std::fs::remove_dir_all(&layout)?;
        self.store_tree(name, tmp, "oci-archive")
    }

    /// A fresh directory in the store (same file system, so storing is a rename), removed
    /// when dropped unless its tree was moved into place.
    fn temp_dir(&self) -> Result<tempfile::TempDir, RuntimeError> {
        std::fs::create_dir_all(&self.dir)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755))?;
        Ok(tempfile::Builder::new()
            .prefix(".tmp-")
            .tempdir_in(&self.dir)?)
    }

    /// Makes `<tmp>/rootfs` safe to share, takes its digest, moves it into place (or drops it
    /// when the same tree is stored already), writes its record and points `name` at it.
    fn store_tree(
        &self,
        name: &str,
        tmp: tempfile::TempDir,
        source: &str,
    ) -> Result<Runtime, RuntimeError> {
        let rootfs = tmp.path().join("rootfs");
        if !rootfs.join("usr/bin/python3").exists() && !is_link(&rootfs.join("usr/bin/python3")) {
            return Err(RuntimeError::NoPython);
        }
        sanitize_tree(&rootfs)?;
        let (hex, bytes) = tree_digest(&rootfs)?;
        let digest = format!("sha256:{hex}");
        let base = self.dir.join(&hex);
        if self.by_digest(&digest).is_none() {
            if base.exists() {
                // A half-stored tree from an interrupted earlier run.
                std::fs::remove_dir_all(&base)?;
            }
            std::fs::create_dir(&base)?;
            std::fs::rename(&rootfs, base.join("rootfs"))?;
            let rt = Runtime {
                name: name.to_string(),
                digest: digest.clone(),
                source: source.to_string(),
                bytes,
                rootfs: PathBuf::new(),
            };
            let rec = serde_json::to_vec_pretty(&rt).map_err(std::io::Error::other)?;
            write_atomic(&base.join("runtime.json"), &rec)?;
        }
        std::fs::create_dir_all(self.names_dir())?;
        write_atomic(&self.names_dir().join(name), digest.as_bytes())?;
        drop(tmp);
        let mut rt = self
            .by_digest(&digest)
            .ok_or_else(|| std::io::Error::other("the stored runtime cannot be read back"))?;
        rt.name = name.to_string();
        Ok(rt)
    }

    /// Removes name `name_or_digest` and, when no other name points at its image, the image;
    /// refused while a function (whose runtime digests are `in_use`) runs on it.
    pub fn remove(&self, name_or_digest: &str, in_use: &[String]) -> Result<(), RuntimeError> {
        let rt = self
            .resolve(name_or_digest)
            .ok_or_else(|| RuntimeError::Unknown(name_or_digest.chars().take(64).collect()))?;
        let count = in_use.iter().filter(|d| **d == rt.digest).count();
        if count > 0 {
            return Err(RuntimeError::InUse {
                name: name_or_digest.to_string(),
                count,
            });
        }
        let names: Vec<String> = std::fs::read_dir(self.names_dir())?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        let mut others = 0;
        for n in names {
            let points = std::fs::read_to_string(self.names_dir().join(&n))
                .map(|d| d.trim() == rt.digest)
                .unwrap_or(false);
            if points {
                if n == name_or_digest || digest_hex(name_or_digest).is_some() {
                    std::fs::remove_file(self.names_dir().join(&n))?;
                } else {
                    others += 1;
                }
            }
        }
        if others == 0 {
            if let Some(hex) = digest_hex(&rt.digest) {
                // The record goes first: a half-removed tree is then never taken for complete.
                let base = self.dir.join(hex);
                std::fs::remove_file(base.join("runtime.json"))?;
                std::fs::remove_dir_all(base)?;
            }
        }
        Ok(())
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

fn check_name(name: &str) -> Result<(), RuntimeError> {
    if hearth_api::function::valid_runtime_name(name) && name != "python3" {
        Ok(())
    } else {
        Err(RuntimeError::BadName(name.chars().take(32).collect()))
    }
}

fn is_link(p: &Path) -> bool {
    p.symlink_metadata()
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)
}

/// The last lines of a tool's output (bounded), for its error.
fn tail(out: &[u8]) -> String {
    let text = String::from_utf8_lossy(out);
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    let mut t: String = lines.into_iter().rev().collect::<Vec<_>>().join("; ");
    t.truncate(1024);
    t
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

/// Drops what no sandbox may get from an image: device nodes, sockets and fifos, setuid and
/// setgid bits, and write permission for anyone but root. Symlinks stay as they are: the tree
/// is only ever the source of read-only bind mounts, where they resolve inside the sandbox.
fn sanitize_tree(root: &Path) -> std::io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let meta = path.symlink_metadata()?;
            let ft = meta.file_type();
            if ft.is_symlink() {
                continue;
            }
            if ft.is_dir() {
                stack.push(path.clone());
            } else if !ft.is_file() {
                std::fs::remove_file(&path)?;
                continue;
            }
            let mode = meta.mode() & 0o7777;
            let safe = mode & !0o6000 & !0o022;
            if safe != mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(safe))?;
            }
            if meta.uid() != 0 || meta.gid() != 0 {
                std::os::unix::fs::lchown(&path, Some(0), Some(0))?;
            }
        }
    }
    Ok(())
}

/// sha256 over a sorted walk of the tree (relative path, type, permission bits, size and
/// content hash, or a link's target; times and owners left out, so the same packages give
/// the same digest), and the bytes of file content.
pub fn tree_digest(root: &Path) -> std::io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut bytes = 0u64;
    let mut stack = vec![PathBuf::new()];
    let mut buf = vec![0u8; 1 << 16];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(root.join(&rel))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        // Directories are pushed in reverse so they come off the stack in order.
        let mut subdirs = Vec::new();
        for n in names {
            let r = rel.join(&n);
            let path = root.join(&r);
            let meta = path.symlink_metadata()?;
            let ft = meta.file_type();
            h.update(r.as_os_str().as_encoded_bytes());
            h.update([0]);
            let mode = meta.mode() & 0o7777;
            if ft.is_symlink() {
                h.update(b"l");
                h.update(std::fs::read_link(&path)?.as_os_str().as_encoded_bytes());
            } else if ft.is_dir() {
                h.update(format!("d{mode:o}"));
                subdirs.push(r);
            } else {
                h.update(format!("f{mode:o} {}", meta.len()));
                let mut f = std::fs::File::open(&path)?;
                let mut fh = Sha256::new();
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    fh.update(&buf[..n]);
                }
                h.update(fh.finalize());
                bytes += meta.len();
            }
            h.update([0]);
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok((hex(&h.finalize()), bytes))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The digests of runtimes in use, for [`RuntimeStore::remove`].
pub fn digests_in_use<'a>(specs: impl Iterator<Item = &'a Option<String>>) -> Vec<String> {
    let set: HashSet<&String> = specs.flatten().collect();
    set.into_iter().cloned().collect()
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

    fn tree(dir: &Path) {
        std::fs::create_dir_all(dir.join("usr/bin")).unwrap();
        std::fs::write(dir.join("usr/bin/python3"), b"#!fake").unwrap();
        std::fs::write(dir.join("etc-file"), b"x").unwrap();
        std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
    }

    #[test]
    fn a_stored_tree_is_found_by_name_and_the_same_tree_is_stored_once() {
        let t = tempfile::tempdir().unwrap();
        let s = RuntimeStore::new(t.path().join("store"));
        let a = s.temp_dir().unwrap();
        tree(&a.path().join("rootfs"));
        // A setuid bit and a world-writable file are made safe before the digest is taken.
        let f = a.path().join("rootfs/etc-file");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4777)).unwrap();
        let one = s.store_tree("py", a, "test").unwrap();
        let mode = std::fs::metadata(one.rootfs.join("etc-file"))
            .unwrap()
            .mode()
            & 0o7777;
        assert_eq!(mode, 0o755);
        let b = s.temp_dir().unwrap();
        tree(&b.path().join("rootfs"));
        std::fs::set_permissions(
            b.path().join("rootfs/etc-file"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let two = s.store_tree("py2", b, "test").unwrap();
        assert_eq!(one.digest, two.digest, "same tree, same digest");
        let names: Vec<String> = s.list().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["py", "py2"]);
        // Removing one name keeps the image for the other; in use, it stays.
        assert!(matches!(
            s.remove("py", std::slice::from_ref(&one.digest)),
            Err(RuntimeError::InUse { .. })
        ));
        s.remove("py", &[]).unwrap();
        assert!(s.resolve("py2").is_some());
        s.remove("py2", &[]).unwrap();
        assert!(!one.rootfs.exists());
        // Only the temporary dirs' parent is left: no half-stored tree.
        let left: Vec<_> = std::fs::read_dir(s.dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("names")]);
    }

    #[test]
    fn a_tree_without_python_is_not_a_runtime() {
        let t = tempfile::tempdir().unwrap();
        let s = RuntimeStore::new(t.path());
        let a = s.temp_dir().unwrap();
        std::fs::create_dir_all(a.path().join("rootfs/usr")).unwrap();
        assert!(matches!(
            s.store_tree("empty", a, "test"),
            Err(RuntimeError::NoPython)
        ));
        assert!(matches!(
            s.build("python3", "bookworm", DEFAULT_MIRROR),
            Err(RuntimeError::BadName(_))
        ));
    }

    #[test]
    fn the_digest_covers_content_modes_and_links_but_not_times() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path());
        let (d1, bytes) = tree_digest(t.path()).unwrap();
        assert_eq!(bytes, 7);
        std::fs::write(t.path().join("etc-file"), b"y").unwrap();
        let (d2, _) = tree_digest(t.path()).unwrap();
        assert_ne!(d1, d2);
        std::fs::remove_file(t.path().join("bin")).unwrap();
        std::os::unix::fs::symlink("usr", t.path().join("bin")).unwrap();
        assert_ne!(tree_digest(t.path()).unwrap().0, d2);
    }
}
